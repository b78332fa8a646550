"""The sidecar as a user runs it: a real process, real HTTP, a real database."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.storage.connect import make_engine
from collector.storage.repo import Repository, SnapshotFilter


def flightrec(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "collector.cli", *args], cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_for_port(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """Read the sidecar's output until it says where it serves."""
    assert proc.stdout is not None
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "serving on http://" in line:
            return line.split("serving on ", 1)[1].split()[0]
    raise AssertionError("sidecar did not start:\n" + "".join(seen))


@pytest.mark.slow
def test_demo_stores_the_crash_snapshot_and_exits_0(demo_run: Any) -> None:
    """``flightrec demo --exit-after-snapshot`` (run once per session by the demo_run fixture,
    which asserts its exit code 0) stores the decode engine's crash snapshot within 2 minutes."""
    assert demo_run.seconds < 120
    assert "crash snapshot" in demo_run.output and "/snapshots/" in demo_run.output
    rows, _ = Repository(make_engine(demo_run.db), host="x").list_snapshots(SnapshotFilter(engine="decode-0"))
    assert rows and rows[0]["step_count"] > 1000
    assert rows[0]["summary"]["kv_cache_usage"] == pytest.approx(0.032)  # the report's figure
    if demo_run.cwd is not None:  # it leaves its database where it ran, and nothing else there
        left = {p.name for p in demo_run.cwd.iterdir()} - {"wd"}
        assert left <= {"demo.db", "demo.db-wal", "demo.db-shm"}, left
        assert "database " + str(demo_run.cwd / "demo.db") in demo_run.output


def test_serve_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    cfg = tmp_path / "flightrec.yaml"
    cfg.write_text(
        f"database: sqlite:///{tmp_path / 'f.db'}\nnvml: off\nkmsg: off\nrecorder_dir: {tmp_path / 'rec'}\n"
        "engines:\n  - name: decode-0\n    url: http://127.0.0.1:9\n"
    )
    proc = flightrec("serve", "--config", str(cfg), "--port", "0", cwd=tmp_path)
    try:
        base = wait_for_port(proc)
        assert base.startswith("http://127.0.0.1:")  # loopback by default
        health = httpx.get(base + "/healthz", timeout=5).json()
        # migrated at start: up, in /healthz as in /metrics, before any write
        assert health["database_up"] is True
        assert re.search(r"^flightrec_database_up\{[^}]*\} 1\.0$", httpx.get(base + "/metrics", timeout=5).text, re.M)
        assert {s["name"] for s in health["sources"]} >= {"recorder"}
        engines = httpx.get(base + "/api/v1/engines", timeout=5).json()["items"]
        assert [e["name"] for e in engines] == ["decode-0"]
        assert "flightrec_engine_up" in httpx.get(base + "/metrics", timeout=5).text
        assert httpx.get(base + "/openapi.json", timeout=5).json()["info"]["title"] == "vLLM Flight Recorder"
        # writes need the token, and none is configured: refused, with a reason
        r = httpx.post(base + "/api/v1/snapshots", json={}, timeout=5)
        assert r.status_code == 403 and "api_token" in r.json()["detail"]
        # nothing answers at :9: the log says so once the scrapes fail (or the grace passes)
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline and httpx.get(base + "/api/v1/engines", timeout=5).json()["items"][0].get("up") is not False:
            time.sleep(0.5)
        time.sleep(5.5)  # the next look at the engines (every 5 s)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopping: flushing" in out
    told = [ln for ln in out.splitlines() if "engine decode-0 at http://127.0.0.1:9" in ln]
    assert len(told) == 1 and "WARNING" in told[0] and ("does not answer" in told[0] or "has not answered" in told[0]), out


def test_serve_without_engines_says_so_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "flightrec.yaml"
    cfg.write_text(f"database: sqlite:///{tmp_path / 'f.db'}\nnvml: off\nkmsg: off\nrecorder_dir: {tmp_path / 'rec'}\n")
    proc = flightrec("serve", "--config", str(cfg), "--port", "0", cwd=tmp_path)
    assert proc.stdout is not None
    early = []  # what it said up to "serving on" (wait_for_port reads those lines away)
    try:
        while not early or "serving on http://" not in early[-1]:
            line = proc.stdout.readline()
            assert line, "".join(early)
            early.append(line)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    out = "".join(early) + out
    assert proc.returncode == 0, out
    assert sum("WARNING" in ln and "no engines to watch: nothing will be recorded" in ln for ln in out.splitlines()) == 1, out


def test_a_database_down_at_start_is_migrated_when_it_comes_back(tmp_path: Path) -> None:
    """The sidecar starts without its database, keeps what it records, and writes it all once
    the database answers (here: a SQLite file whose folder appears later)."""
    import asyncio

    from collector.model import Event, EventKind, Severity, StepRecord
    from collector.service import Service
    from collector.settings import EngineConfig, Settings

    missing = tmp_path / "not-yet"
    (tmp_path / "blocker").write_text("")  # a file where the database's folder should be
    db = f"sqlite:///{tmp_path / 'blocker' / 'f.db'}"
    settings = Settings(
        engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")],
        database=db,
        nvml="off",
        kmsg="off",
        port=0,
        recorder_dir=tmp_path / "rec",
        write_batch_interval=0.1,
    )
    svc = Service(settings, spool_dir=missing / "spool")

    async def scenario() -> None:
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        assert svc.ctx is not None
        svc._migrate_every = 0.2  # noqa: SLF001
        for i in range(50):
            svc.ctx.hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=1))
        svc.ctx.hub.emit(
            Event(kind=EventKind.ENGINE_DEAD, ts=time.time(), source="log", engine="decode-0", message="EngineDeadError", severity=Severity.CRITICAL)
        )
        await asyncio.sleep(0.5)
        assert svc.ctx.writer.db_up is False
        (tmp_path / "blocker").unlink()
        (tmp_path / "blocker").mkdir()  # the database can now be created
        for _ in range(100):
            if svc.ctx.committer.committed and svc.ctx.writer.db_up:
                break
            await asyncio.sleep(0.1)
        svc.request_stop()
        await task

    asyncio.run(scenario())
    repo = Repository(make_engine(db), host=svc.ctx.hub.host)  # type: ignore[union-attr]
    rows, _ = repo.list_snapshots(SnapshotFilter(engine="decode-0"))
    assert len(rows) == 1 and rows[0]["step_count"] == 50
    assert len(repo.recent_steps("decode-0", since=0)) == 50


@pytest.mark.slow
def test_the_demo_fault_is_stored_once_and_linked_to_its_snapshot(demo_run: Any) -> None:
    """The Xid seen by the kernel log and NVML is one event row, pointing at the snapshot."""
    import sqlite3

    conn = sqlite3.connect(demo_run.db.split("///", 1)[1])
    xids = conn.execute("SELECT xid, snapshot_id, data FROM events WHERE kind = 'xid'").fetchall()
    sid = conn.execute("SELECT id FROM snapshots WHERE engine = 'decode-0'").fetchone()[0]
    assert len(xids) == 1 and xids[0][0] == 43 and xids[0][1] == sid
    assert sorted(json.loads(xids[0][2])["sources"]) == ["kmsg", "nvml"]
    assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] > 0


def test_a_stage_that_raises_is_restarted_and_says_so_in_healthz_and_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's loop raises once (a bug, not a database error): the supervisor restarts it,
    /healthz and /metrics show the restart and its error, and steps go on being stored."""
    import asyncio

    from prometheus_client.parser import text_string_to_metric_families

    from collector.model import StepRecord
    from collector.service import Service
    from collector.settings import Settings
    from collector.storage.writer import BatchWriter

    db = f"sqlite:///{tmp_path / 'f.db'}"
    # no engine to scrape (a failing scrape would make /healthz degraded on its own): steps come in by hand
    settings = Settings(engines=[], database=db, nvml="off", kmsg="off", port=0, recorder_dir=tmp_path / "rec", write_batch_interval=0.1)
    svc = Service(settings, spool_dir=tmp_path / "spool")
    real_flush = BatchWriter.flush
    raised = 0

    async def flush_raising_once(self: BatchWriter, *, everything: bool = False) -> None:
        nonlocal raised
        if raised == 0 and self.pending_rows:
            raised += 1
            raise KeyError("injected writer bug")
        await real_flush(self, everything=everything)

    monkeypatch.setattr(BatchWriter, "flush", flush_raising_once)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        assert svc.ctx is not None
        base = f"http://127.0.0.1:{svc.port}"
        for i in range(20):
            svc.ctx.hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=1))
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            for _ in range(500):  # the failure is seen while the writer waits its backoff (0.5 s), on the loop itself
                health = svc.ctx.health()
                writer = next(t for t in health["tasks"] if t["name"] == "writer")
                if not writer["up"]:
                    seen["down"] = (health["status"], writer)
                    break
                await asyncio.sleep(0.01)
            for _ in range(100):
                health = (await client.get("/healthz")).json()
                writer = next(t for t in health["tasks"] if t["name"] == "writer")
                if writer["up"] and writer["restarts"] == 1 and health["ingest"]["steps_written"] >= 20:
                    break
                await asyncio.sleep(0.1)
            seen["after"] = (health, writer)
            for i in range(20, 40):  # still storing after the restart
                svc.ctx.hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=1))
            for _ in range(100):
                if svc.ctx.writer.steps_written >= 40:
                    break
                await asyncio.sleep(0.1)
            seen["metrics"] = (await client.get("/metrics")).text
        svc.request_stop()
        await task

    asyncio.run(scenario())
    status, down = seen["down"]
    assert status == "degraded" and down["last_error"] == "KeyError: 'injected writer bug'" and down["since"] > 0
    health, writer = seen["after"]
    assert health["status"] == "ok" and writer["up"] and writer["restarts"] == 1
    assert {t["name"] for t in health["tasks"]} >= {"writer", "snapshots", "detectors", "retention", "heartbeat"}
    assert all(t["restarts"] == 0 for t in health["tasks"] if t["name"] != "writer")
    metrics = {
        (s.name, s.labels.get("task")): s.value
        for fam in text_string_to_metric_families(seen["metrics"])
        for s in fam.samples
        if s.name.startswith("flightrec_task_")
    }
    assert metrics[("flightrec_task_restarts_total", "writer")] == 1
    assert metrics[("flightrec_task_up", "writer")] == 1 and metrics[("flightrec_task_restarts_total", "snapshots")] == 0
    rows = Repository(make_engine(db), host=svc.ctx.hub.host).recent_steps("decode-0", since=0)  # type: ignore[union-attr]
    assert sorted(r["step"] for r in rows) == list(range(40))  # nothing lost: the first 20 waited in the queue


# The sidecar's steps, in start order (the stages and sources run while HTTP binds: ``listening``
# waits for it last); a stop runs them bottom to top: the sources end first (no new input), what
# is held is made durable, then the stages, the alerts, HTTP, the stores.
SERVICE_STEPS = [
    "signals",
    "stores",
    "http",
    "writer",
    "snapshots",
    "detectors",
    "wedges",
    "retention",
    "departures",
    "heartbeat",
    "durability",
    "sources",
    "listening",
]


def test_the_service_stops_its_steps_in_the_declared_reverse_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The declared order is what happens at a stop, and a step whose stop fails (the writer's
    last flush raising) does not keep the later ones (HTTP, the stores) from stopping."""
    import asyncio

    from collector.service import Service
    from collector.settings import Settings
    from collector.storage.writer import BatchWriter

    settings = Settings(engines=[], database=f"sqlite:///{tmp_path / 'f.db'}", nvml="off", kmsg="off", port=0, recorder_dir=tmp_path / "rec")
    svc = Service(settings, spool_dir=tmp_path / "spool")

    async def flush_failing(self: BatchWriter, *, everything: bool = False) -> None:
        if everything:
            raise OSError("injected: the last flush fails")

    monkeypatch.setattr(BatchWriter, "flush", flush_failing)

    async def scenario() -> None:
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        assert svc.steps.names == SERVICE_STEPS
        svc.request_stop()
        await task

    asyncio.run(scenario())
    assert svc.steps.stopped == list(reversed(SERVICE_STEPS))
    assert svc.steps.stop_failures == ["durability"]
    assert svc.server is not None and svc.server.should_exit


def test_a_committed_snapshot_has_the_heap_trimmed_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    from types import SimpleNamespace

    from collector import malloc, service
    from collector.settings import Settings

    trims: list[float] = []

    def trim() -> bool:
        trims.append(time.monotonic())
        return True

    monkeypatch.setattr(malloc, "trim", trim)
    monkeypatch.setattr(service, "TRIM_AFTER_S", 0.05)
    svc = service.Service(Settings(database=f"sqlite:///{tmp_path}/x.db", engines=[]))
    ctx = SimpleNamespace(snapshot_counts={}, alerter=None)
    svc.ctx = ctx  # type: ignore[assignment]
    doc = SimpleNamespace(engine="decode-0")
    trigger = SimpleNamespace(kind=SimpleNamespace(value="xid"))

    async def commit_then_wait() -> float:
        svc._committed(doc, trigger)  # type: ignore[arg-type]
        at = time.monotonic()
        assert trims == []  # not while the commit still holds its copies
        await asyncio.sleep(0.2)
        return at

    at = asyncio.run(commit_then_wait())
    assert len(trims) == 1 and trims[0] - at >= 0.04
    assert ctx.snapshot_counts == {("decode-0", "xid"): 1}
