"""The demo end to end: its snapshot's plan is the incident's ramp, and ``flightrec replay``
against a fresh simulated pair (``flightrec demo --serve-completions``, watched by its sidecar)
reproduces the crash in the C16 phase, names the new snapshot and links it from the first."""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.cli import main
from collector.storage.connect import make_engine
from collector.storage.repo import Repository, SnapshotFilter


def demo_snapshot(demo_run: Any, tmp_path: Path) -> tuple[str, int]:
    """A copy of the demo's database (other tests read the original) and its decode snapshot."""
    src = Path(demo_run.db.removeprefix("sqlite:///"))
    shutil.copy(src, tmp_path / "demo.db")
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    repo = Repository(make_engine(db), host="x")
    rows, _ = repo.list_snapshots(SnapshotFilter(engine="decode-0"))
    assert rows, demo_run.output
    snap_id = int(rows[-1]["id"])
    if repo.get_snapshot(snap_id, parts=("workload",)).workload is None:
        pytest.skip("the demo's snapshot has no workload: the sidecar does not feed its workload log yet")
    return db, snap_id


def test_the_demo_snapshot_plans_the_incident_ramp(demo_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, snap_id = demo_snapshot(demo_run, tmp_path)
    assert main(["replay", "--plan", str(snap_id), "--db", db]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:7]]
    assert [(r[1], r[2]) for r in rows] == [("C1", "4"), ("C2", "6"), ("C4", "12"), ("C8", "16"), ("C16", "25")]
    assert all("32000/32000/32000" in line and "2000/2000/2000" in line for line in out.splitlines()[2:7])
    assert out.splitlines()[6].endswith("10/15  <- fault")
    # the export carries the workload: the same plan from a file, as on another site
    export = tmp_path / "snap.json.gz"
    assert main(["snapshots", "export", str(snap_id), "--db", db, "-o", str(export)]) == 0
    assert json.loads(gzip.decompress(export.read_bytes()))["workload"]["counts"]["failed_by_crash"] == 15
    capsys.readouterr()
    assert main(["replay", "--plan", "--from-file", str(export)]) == 0
    assert capsys.readouterr().out.splitlines()[2:7] == out.splitlines()[2:7]


def _read_lines(proc: subprocess.Popen[str], q: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        q.put(line)


def test_replay_against_the_demo_pair_dies_in_c16_and_links_the_new_snapshot(
    demo_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLIGHTREC_API_TOKEN", "replay-token-1")  # the link is a write, through the sidecar
    db, snap_id = demo_snapshot(demo_run, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "demo", "--serve-completions", "--port", "0", "--db", db, "--workdir", str(tmp_path / "wd")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "FLIGHTREC_SNAPSHOT_SETTLE_S": "1", "FLIGHTREC_API_TOKEN": "replay-token-1"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
    seen: list[str] = []
    try:
        api = target = None
        deadline = time.monotonic() + 60
        while (api is None or target is None) and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            seen.append(line)
            if m := re.search(r"API (http://\S+)/api/v1", line):
                api = m.group(1)
            if m := re.search(r"replay target: (http://\S+) ", line):
                target = m.group(1)
        assert api and target, "".join(seen)
        # the original is fetched (and cached) by the sidecar before the replay links to it
        assert httpx.get(f"{api}/api/v1/snapshots/{snap_id}", timeout=30).status_code == 200
        rc = main(["replay", str(snap_id), "--target", target, "--sidecar", api, "--db", db])
        out = capsys.readouterr().out
        served = httpx.get(f"{api}/api/v1/snapshots/{snap_id}", timeout=30).json()["summary"].get("replays")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert rc == 0, out
    assert "engine died again: yes, in phase 5 (C16) after 10 done there" in out, out
    assert "the original died in the same phase after 10 done there" in out
    table = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+C\d+", line)]
    assert [(r[1], r[3], r[4]) for r in table] == [("C1", "4", "0"), ("C2", "6", "0"), ("C4", "12", "0"), ("C8", "16", "0"), ("C16", "10", "15")]
    m = re.search(r"new snapshot: (\d+) \(decode-0", out)
    assert m, out
    new_id = int(m.group(1))
    assert "prompt lengths same, max tokens same, concurrency same, fault point same" in out, out
    replays = Repository(make_engine(db), host="x").get_snapshot(snap_id, parts=()).summary["replays"]
    assert replays[-1]["snapshot_id"] == new_id and replays[-1]["died_concurrency"] == 16
    assert served == replays, "the sidecar serves the link at once, not its cached copy"
