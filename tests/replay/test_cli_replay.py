"""``flightrec replay`` on the command line: arguments and errors, an export file, and Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from replay_helpers import ramp_workload

from collector.cli import main
from collector.snapshot.document import SnapshotDoc
from collector.storage.connect import make_engine
from collector.storage.repo import Repository


def export_file(tmp_path: Path, workload: dict | None) -> Path:
    doc = SnapshotDoc(host="node-a", engine="decode-0", created_at=1.0, fault_ts=1.0, trigger={"kind": "cuda_error"}, workload=workload, id=4)
    path = tmp_path / "snap.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc.to_export()).encode()))
    return path


def test_arguments_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--plan"]) == 2
    assert "SNAPSHOT_ID or --from-file" in capsys.readouterr().err
    old = export_file(tmp_path, None)  # a snapshot without a workload
    assert main(["replay", "--plan", "--from-file", str(old)]) == 1
    assert "holds no workload" in capsys.readouterr().err
    good = export_file(tmp_path, ramp_workload(((1, 2),)))
    assert main(["replay", "--from-file", str(good)]) == 2
    assert "needs --target" in capsys.readouterr().err
    assert main(["replay", "--from-file", str(tmp_path / "missing.json.gz"), "--plan"]) == 1


def test_plan_from_the_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'f.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    doc = SnapshotDoc(
        host="node-a",
        engine="decode-0",
        created_at=time.time(),
        fault_ts=time.time(),
        trigger={"kind": "cuda_error", "source": "log", "message": "x"},
        workload=ramp_workload(((1, 2), (4, 8)), crash_in_last_after=3),
    )
    sid = Repository(make_engine(db), host="node-a").store_snapshot(doc, incident_window_s=30, incident_key="k")[0]
    capsys.readouterr()
    assert main(["replay", "--plan", str(sid), "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"plan of snapshot {sid} (decode-0, the engine died): 9 requests" in out and "3/4  <- fault" in out
    assert main(["replay", "--plan", str(sid + 1), "--db", db]) == 1
    assert "not found" in capsys.readouterr().err


@contextlib.contextmanager
def slow_target(seconds: float) -> Iterator[str]:
    """An OpenAI-compatible server whose completions take ``seconds``."""
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {}

    @app.post("/v1/completions")
    async def completions() -> dict[str, object]:
        await asyncio.sleep(seconds)
        return {"choices": [{"text": ""}], "usage": {"completion_tokens": 1}}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_ctrl_c_stops_cleanly_with_the_table_so_far(tmp_path: Path) -> None:
    path = export_file(tmp_path, ramp_workload(((1, 4), (2, 6)), duration=1.0))
    with slow_target(0.8) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "collector.cli", "replay", "--from-file", str(path), "--target", url, "--model", "m"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # plain progress lines (stdout is not a terminal), until under way
            seen.append(line)
            if "phase 1/2 C1  done" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        out = "".join(seen) + rest
    assert proc.returncode == 130, out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert rows[0][:3] == ["1", "C1", "4"] and rows[1][:3] == ["2", "C2", "6"]
    planned, done, failed, not_sent = (int(x) for x in rows[1][2:6])
    assert not_sent >= 1 and done + failed + not_sent == planned  # stopped before the end, all counted
    assert "replay interrupted: the table shows the load so far" in out
    assert "Traceback" not in out
