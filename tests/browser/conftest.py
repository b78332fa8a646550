"""The crash snapshot of the demo, stored once per session, and the API serving it over HTTP."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
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


def run_demo(workdir: Path) -> str:
    """Run ``flightrec demo --exit-after-snapshot`` into a SQLite file; returns its URL."""
    db = f"sqlite:///{workdir / 'demo.db'}"
    env = dict(os.environ)
    # the snapshot is amended with the late evidence (the workers' tracebacks, emitted once
    # the log has been quiet for its idle-flush second): give it the time to arrive
    env["FLIGHTREC_SNAPSHOT_SETTLE_S"] = "3"
    proc = subprocess.run(
        [sys.executable, "-m", "collector.cli", "demo", "--exit-after-snapshot", "--port", "0", "--db", db,
         "--workdir", str(workdir / "wd")],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return db


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    workdir = tmp_path_factory.mktemp("demo")
    prebuilt = os.environ.get("FLIGHTREC_TEST_DEMO_DB")  # a demo.db kept from an earlier run
    if prebuilt:
        shutil.copy(prebuilt, workdir / "demo.db")
        return f"sqlite:///{workdir / 'demo.db'}"
    return run_demo(workdir)


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
