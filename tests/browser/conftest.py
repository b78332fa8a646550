"""The crash snapshot of the demo, stored once per session, and the API serving it over HTTP."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.api.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from api_context import make_context  # noqa: E402  (tests/api: the API's context)
from browser_server import ServerThread, free_port  # noqa: E402


@pytest.fixture(scope="session")
def demo_db(demo_run: object) -> str:
    return demo_run.db  # type: ignore[attr-defined]


@pytest.fixture
def serve(demo_db: str) -> Iterator[object]:
    def start(**settings: object) -> ServerThread:
        ctx = make_context(demo_db, host_name="demo-host", **settings)
        return ServerThread(create_app(ctx), free_port())

    yield start


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the browser tests leave their screenshots: FLIGHTREC_SCREENSHOT_DIR, else a folder
    of pytest's own temporary tree (its path is printed with each picture: ``pytest -s``)."""
    import os

    chosen = os.environ.get("FLIGHTREC_SCREENSHOT_DIR")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
