"""The crash snapshot of the demo, stored once per session, and the API serving it over HTTP."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from collector.api.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from api_context import make_context  # noqa: E402  (tests/api: the API's context)

PORTS = range(18520, 18560)


@pytest.fixture(scope="session")
def demo_db(demo_run: object) -> str:
    return demo_run.db  # type: ignore[attr-defined]


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18520-18559")


class ServerThread:
    def __init__(self, app: object, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the API server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def serve(demo_db: str) -> Iterator[object]:
    def start(**settings: object) -> ServerThread:
        ctx = make_context(demo_db, host_name="demo-host", **settings)
        return ServerThread(create_app(ctx), free_port())

    yield start
