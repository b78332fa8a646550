from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector.ingest.hub import Hub
from collector.model import Event, EventKind, LogLine, Severity, StepRecord
from collector.settings import EngineConfig, Settings
from collector.snapshot.committer import SnapshotManager
from collector.storage.db import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository, SnapshotFilter


def setup(url: str, tmp_path: Path, settle: float = 0.2) -> tuple[Hub, Repository, SnapshotManager, list[int]]:
    hub = Hub(Settings(engines=[EngineConfig(name="decode-0", url="http://d")], ring_steps=32))
    repo = Repository(make_engine(url), host=hub.host)
    committed: list[int] = []
    mgr = SnapshotManager(hub, repo, spool_dir=tmp_path / "spool", settle_s=settle, window_s=30,
                          on_committed=lambda doc, ev: committed.append(doc.id))  # fmt: skip
    return hub, repo, mgr, committed


def fault(kind: EventKind, source: str, msg: str) -> Event:
    return Event(kind=kind, ts=time.time(), source=source, message=msg, engine="decode-0", severity=Severity.CRITICAL)


def test_four_witnesses_one_snapshot_amended_with_the_late_evidence(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, mgr, committed = setup(migrated_url, tmp_path)

    async def scenario() -> None:
        task = asyncio.create_task(mgr.run())
        for i in range(50):
            hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=4))
        hub.emit(fault(EventKind.XID, "kmsg", "Xid 43"))
        await asyncio.sleep(0.05)
        # late witnesses of the same fault, and the last steps the recorder flushed
        for i in range(50, 53):
            hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=4))
        hub.emit(LogLine("decode-0", time.time(), "(Worker_TP0 pid=1) ERROR CUDA error: unspecified launch failure"))
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "CUDA error: unspecified launch failure"))
        hub.emit(fault(EventKind.ENGINE_FATAL, "log", "EngineCore encountered a fatal error."))
        hub.emit(fault(EventKind.ENGINE_DOWN, "scrape", "health failing"))
        await asyncio.sleep(0.6)
        task.cancel()

    asyncio.run(scenario())
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 1 and committed == [rows[0]["id"]]
    doc = repo.get_snapshot(rows[0]["id"])
    assert doc.trigger["kind"] == "xid"
    assert doc.steps[-1]["step"] == 52  # the amendment holds the steps that came after the trigger
    assert {e["kind"] for e in doc.events} >= {"xid", "cuda_error", "engine_fatal", "engine_down"}
    assert any("unspecified launch failure" in line["line"] for line in doc.log_lines)
    assert not list((tmp_path / "spool").glob("*.json.gz"))


def test_database_down_spools_and_commits_when_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'f.db'}"
    hub, repo, mgr, committed = setup(url, tmp_path)  # not migrated yet: every commit fails

    async def scenario() -> None:
        task = asyncio.create_task(mgr.run())
        hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=1, running=1))
        hub.emit(fault(EventKind.ENGINE_DEAD, "log", "EngineDeadError"))
        await asyncio.sleep(0.3)
        assert committed == [] and len(list((tmp_path / "spool").glob("*.json.gz"))) == 1
        await asyncio.to_thread(upgrade, url)  # the database comes back
        for _ in range(60):
            if committed:
                break
            await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(scenario())
    assert len(committed) == 1
    assert repo.get_snapshot(committed[0]).steps[0]["step"] == 1
    assert not list((tmp_path / "spool").glob("*.json.gz"))


def test_a_spooled_snapshot_survives_a_restart(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, mgr, _ = setup(migrated_url, tmp_path)
    hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=7, running=1))
    doc = hub.freeze("decode-0", fault(EventKind.MANUAL, "api", "before the restart"))
    assert mgr._spool(doc) is not None

    async def restart() -> None:
        task = asyncio.create_task(mgr.run())
        await asyncio.sleep(0.5)
        task.cancel()

    asyncio.run(restart())
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert [r["trigger_message"] for r in rows] == ["before the restart"]


def test_the_first_commit_reads_what_the_recorder_published_last(migrated_url: str, tmp_path: Path) -> None:
    """Steps the engine wrote just before the fault, not yet polled, are read before the freeze."""
    hub, repo, mgr, committed = setup(migrated_url, tmp_path, settle=60)  # no amendment in this test
    unread = [StepRecord(engine="decode-0", ts=time.time(), step=i, running=3) for i in (8, 9)]
    mgr.before_freeze = lambda: [hub.emit(r) for r in unread]

    async def scenario() -> None:
        task = asyncio.create_task(mgr.run())
        for i in range(8):
            hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=3))
        hub.emit(fault(EventKind.ENGINE_DEAD, "log", "EngineDeadError"))
        for _ in range(100):
            if committed:
                break
            await asyncio.sleep(0.02)
        task.cancel()

    asyncio.run(scenario())
    assert repo.get_snapshot(committed[0]).steps[-1]["step"] == 9
