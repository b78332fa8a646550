"""A wedge's snapshot, through the trigger path every snapshot takes (``Hub.emit`` of an
``engine_wedged`` event): committed at once, its engine's stacks read beside it from a real
process by a real py-spy, stored with its amendment, on SQLite and Postgres. A crash's snapshot
has no stacks part; a py-spy that hangs costs the stacks only."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.model import HALF_STATS, Event, EventKind, Fingerprint, Severity, StepRecord
from collector.settings import EngineConfig, Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.snapshot.document import SnapshotDoc, export_gzip
from collector.snapshot.freeze import is_trigger
from collector.stacks import pyspy
from collector.stacks.capture import StackReader
from collector.stacks.settings import StacksSettings
from collector.storage.connect import make_engine
from collector.storage.repo import Repository, SnapshotFilter
from tests.wiring import with_committer

CHILD = Path(__file__).resolve().parents[1] / "stacks" / "blocked_child.py"
needs_py_spy = pytest.mark.skipif(pyspy.find_binary() is None, reason="py-spy is a dependency: pip install -e .")


@pytest.fixture
def engine_core() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(
        [sys.executable, str(CHILD), "VLLM::EngineCore"], stdout=subprocess.PIPE, env={"PATH": os.environ.get("PATH", ""), "NCCL_DEBUG": "INFO"}
    )
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    time.sleep(0.5)  # "ready" comes just before the main thread enters the function it blocks in
    yield p
    p.kill()
    p.wait()


def setup(url: str, tmp_path: Path, reader: StackReader) -> tuple[Any, Repository, SnapshotCommitter, list[tuple[float, SnapshotDoc]]]:
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:8000")], ring_steps=32, host_name="node-a")
    repo = Repository(make_engine(url), host="node-a")
    committed: list[tuple[float, SnapshotDoc]] = []
    hub, c = with_committer(
        settings,
        repo,
        spool_dir=tmp_path / "spool",
        settle_s=0.2,
        window_s=30,
        on_committed=[lambda doc, ev: committed.append((time.time(), doc))],
        retry_every=0.1,
        stack_reader=reader,
    )
    return hub, repo, c, committed


def steps(hub: Any, pid: int, n: int = 20) -> None:
    hub.emit(Fingerprint("decode-0", time.time(), {"engine_core_pid": pid, "server_pid": 1 << 22, "model": "tiny"}))
    for i in range(n):
        hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=8, waiting=0, kv_cache_usage=0.1, halves=HALF_STATS))


def wedged() -> Event:
    return Event(
        kind=EventKind.ENGINE_WEDGED,
        ts=time.time(),
        source="detector",
        message="decode-0 wedged: 8 requests running, no step for 20.0 s",
        engine="decode-0",
        severity=Severity.CRITICAL,
    )


async def amended(repo: Repository, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows, _ = await asyncio.to_thread(repo.list_snapshots, SnapshotFilter())
        if rows and rows[0]["summary"].get("amended_at"):
            return rows[0]
        await asyncio.sleep(0.1)
    raise AssertionError("the snapshot was not amended")


async def run(c: SnapshotCommitter, body: Any) -> Any:
    task = asyncio.create_task(c.run())
    try:
        return await body()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_a_wedge_is_a_trigger() -> None:
    assert is_trigger(wedged())


@needs_py_spy
def test_the_wedge_snapshot_is_committed_first_and_amended_with_the_stacks(
    migrated_url: str, tmp_path: Path, engine_core: subprocess.Popen[bytes]
) -> None:
    reader = StackReader(StacksSettings(interval_s=4.0), recorder_dir=None)
    hub, repo, c, committed = setup(migrated_url, tmp_path, reader)
    steps(hub, engine_core.pid)
    ev = wedged()

    async def body() -> dict[str, Any]:
        hub.emit(ev)
        return await amended(repo)

    row = asyncio.run(run(c, body))
    reader.close()
    doc = repo.get_snapshot(row["id"])
    # the first commit did not wait for the two dumps (4 s apart) and said they were being read
    ((at, first),) = committed
    assert first.summary["stacks"]["status"] == "reading"
    assert doc.stacks is not None and at < doc.stacks["processes"][0]["dumps"][1]["ts"]
    assert doc.trigger["kind"] == "engine_wedged" and len(doc.steps) == 20
    stacks = doc.stacks
    assert stacks is not None and stacks["status"] == "captured", stacks["reasons"]
    (proc,) = stacks["processes"]
    assert (proc["role"], proc["pid"], proc["state"]) == ("engine_core", engine_core.pid, "stuck")
    assert proc["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"
    assert stacks["env"]["NCCL_DEBUG"] == "INFO"
    # the summary names it too (what the list API and the page's header read)
    assert row["summary"]["stacks"]["processes"][0]["blocking"].startswith("wait_for_the_engine_lock (")
    # and the export carries it, spliced from the stored part
    header, blobs = repo.get_snapshot_blobs(row["id"])
    import gzip
    import json

    export = json.loads(gzip.decompress(export_gzip(header.header(), blobs)))
    assert export["stacks"]["processes"][0]["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"


def test_a_crash_snapshot_has_no_stacks_part(migrated_url: str, tmp_path: Path) -> None:
    reader = StackReader(StacksSettings(interval_s=0.5), recorder_dir=None, binary="/nonexistent/py-spy")
    hub, repo, c, _ = setup(migrated_url, tmp_path, reader)
    steps(hub, os.getpid())

    async def body() -> dict[str, Any]:
        hub.emit(Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message="Xid 43", xid=43, engine="decode-0", severity=Severity.CRITICAL))
        return await amended(repo)

    row = asyncio.run(run(c, body))
    _, blobs = repo.get_snapshot_blobs(row["id"])
    assert "stacks" not in blobs and "stacks" not in row["summary"]
    doc = repo.get_snapshot(row["id"])
    assert doc.stacks is None and "stacks" not in doc.to_export()


def test_a_hung_py_spy_leaves_the_snapshot_whole_with_one_line(migrated_url: str, tmp_path: Path, engine_core: subprocess.Popen[bytes]) -> None:
    d = Path(tempfile.mkdtemp(prefix="flightrec-pyspy-"))
    (d / "py-spy").write_text("#!/bin/sh\nsleep 60\n")
    (d / "py-spy").chmod(0o755)
    reader = StackReader(StacksSettings(interval_s=0.5, timeout_s=1.0), recorder_dir=None, binary=str(d / "py-spy"))
    hub, repo, c, _ = setup(migrated_url, tmp_path, reader)
    steps(hub, engine_core.pid)

    async def body() -> dict[str, Any]:
        hub.emit(wedged())
        return await amended(repo)

    t0 = time.monotonic()
    row = asyncio.run(run(c, body))
    assert time.monotonic() - t0 < reader.bound_s + 5
    doc = repo.get_snapshot(row["id"])
    assert len(doc.steps) == 20 and doc.trigger["kind"] == "engine_wedged"
    assert doc.stacks is not None and doc.stacks["status"] == "unavailable"
    (line,) = doc.stacks["reasons"]
    assert "did not answer within 1 s" in line and f"engine_core {engine_core.pid}" in line
    assert row["summary"]["stacks"]["reason"] == line


def test_a_stop_before_the_dumps_end_says_so(migrated_url: str, tmp_path: Path, engine_core: subprocess.Popen[bytes]) -> None:
    reader = StackReader(StacksSettings(interval_s=30.0), recorder_dir=None)
    hub, repo, c, committed = setup(migrated_url, tmp_path, reader)
    steps(hub, engine_core.pid)

    async def body() -> None:
        hub.emit(wedged())
        deadline = time.monotonic() + 20
        while not committed and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await c.drain(timeout=10)

    asyncio.run(run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    doc = repo.get_snapshot(rows[0]["id"])
    assert doc.stacks is not None and doc.stacks["status"] == "unavailable"
    assert "the sidecar stopped before the two dumps were done" in doc.stacks["reasons"][0]


def collapsed() -> Event:
    return Event(
        kind=EventKind.ANOMALY,
        ts=time.time(),
        source="detector",
        message="throughput_collapse critical: 0.0 tokens/s is 0% of the 12.0 tokens/s baseline with 8 requests in the engine",
        engine="decode-0",
        severity=Severity.CRITICAL,
    )


@needs_py_spy
def test_a_wedge_inside_another_snapshots_window_has_its_own_snapshot_and_stacks(
    migrated_url: str, tmp_path: Path, engine_core: subprocess.Popen[bytes]
) -> None:
    """A real SIGSTOPped engine core: the throughput-collapse detector and the wedge watch fire in
    the same second, the collapse first. The wedge opens its own snapshot, which reads the
    stacks; a second wedge of the same engine inside the window (it moved, then stopped again)
    does too."""
    reader = StackReader(StacksSettings(interval_s=1.0), recorder_dir=None)
    hub, repo, c, committed = setup(migrated_url, tmp_path, reader)
    steps(hub, engine_core.pid)

    async def body() -> list[dict[str, Any]]:
        hub.emit(collapsed())
        hub.emit(wedged())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows, _ = await asyncio.to_thread(repo.list_snapshots, SnapshotFilter())
            if len(rows) == 2 and all(r["summary"].get("amended_at") for r in rows):
                break
            await asyncio.sleep(0.1)
        hub.emit(wedged())  # the next wedge, 30 s window still open
        while time.monotonic() < deadline:
            rows, _ = await asyncio.to_thread(repo.list_snapshots, SnapshotFilter())
            if len(rows) == 3 and all(r["summary"].get("amended_at") for r in rows):
                return rows
            await asyncio.sleep(0.1)
        raise AssertionError(f"not three amended snapshots: {rows}")

    rows = asyncio.run(run(c, body))
    reader.close()
    kinds = sorted(r["trigger_kind"] for r in rows)
    assert kinds == ["anomaly", "engine_wedged", "engine_wedged"], kinds
    for r in rows:
        doc = repo.get_snapshot(r["id"])
        if r["trigger_kind"] == "engine_wedged":
            assert doc.stacks is not None and doc.stacks["status"] == "captured", doc.stacks
            assert doc.stacks["processes"][0]["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"
        else:
            assert doc.stacks is None
