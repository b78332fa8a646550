"""A trigger read again at start (the kernel log resumes after its mark, ``data["replayed"]``):
snapshotted as the rings were at its time, once, whichever way the killed run left it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector.model import HALF_STATS, Event, EventKind, Severity, StepRecord
from collector.snapshot import intent
from collector.storage.repo import SnapshotFilter
from tests.snapshot.test_committer import _run, setup

UID = "0123456789abcdef0123456789abcdef"  # made from the record's place: the same each time it is read


def _xid(ts: float, *, replayed: bool) -> Event:
    data: dict[str, object] = {"kernel_seq": 360}
    if replayed:
        data["replayed"] = True
    return Event(kind=EventKind.XID, ts=ts, source="kmsg", message="Xid 43", severity=Severity.CRITICAL, xid=43, data=data, uid=UID)


def _ring(t0: float, n: int) -> list[StepRecord]:
    return [StepRecord(engine="decode-0", ts=t0 + i * 0.5, step=i, running=3, halves=HALF_STATS) for i in range(n)]


async def _until(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.05)


def test_a_replayed_trigger_holds_the_rings_at_its_time_and_is_not_amended(migrated_url: str, tmp_path: Path) -> None:
    t0 = time.time() - 30
    hub, repo, c, committed = setup(migrated_url, tmp_path)
    fault_ts = t0 + 10

    async def body() -> None:
        for s in _ring(t0, 30):  # the ring read again at the restart: it goes on 5 s past the fault
            hub.emit(s)
        hub.emit(_xid(fault_ts, replayed=True))
        await _until(lambda: committed)
        await asyncio.sleep(c.settle_s + 0.3)  # an amendment would come now

    asyncio.run(_run(c, body))
    [row] = repo.list_snapshots(SnapshotFilter())[0]
    doc = repo.get_snapshot(row["id"])
    assert row["fault_ts"] == fault_ts and doc.steps[-1]["ts"] <= fault_ts + c.settle_s and doc.steps[-1]["step"] == 20
    assert doc.summary["replayed"]["steps_after_fault_left_out"] == 9
    assert not doc.summary.get("amended_at")


def test_a_trigger_read_again_after_its_snapshot_was_committed_is_not_stored_twice(migrated_url: str, tmp_path: Path) -> None:
    """Killed after the commit, before the mark moved past the kernel's line."""
    t0 = time.time() - 5
    hub, repo, c, committed = setup(migrated_url, tmp_path)

    async def first() -> None:
        for s in _ring(t0, 5):
            hub.emit(s)
        hub.emit(_xid(t0 + 2, replayed=False))
        await _until(lambda: committed)

    asyncio.run(_run(c, first))
    assert len(committed) == 1

    hub2, repo2, c2, committed2 = setup(migrated_url, tmp_path)  # the restart reads the line again

    async def again() -> None:
        for s in _ring(t0, 12):
            hub2.emit(s)
        ev = _xid(t0 + 2.001, replayed=True)
        hub2.emit(ev)
        [o] = c2.opens_for(ev)
        assert o.committed is not None
        await asyncio.wait_for(o.committed, 10)

    asyncio.run(_run(c2, again))
    assert committed2 == []  # no second page for it either
    assert len(repo2.list_snapshots(SnapshotFilter())[0]) == 1
    assert len([e for e in repo2.list_events() if e["kind"] == "xid"]) == 1
    assert not intent.pending(tmp_path / "spool")


def test_a_trigger_read_again_whose_intent_the_kill_left_is_retaken_once(migrated_url: str, tmp_path: Path) -> None:
    """Killed after the intent, before the commit: the intent retakes it; the line read again opens nothing."""
    t0 = time.time() - 5
    ev = _xid(t0 + 2, replayed=False)
    intent.write(tmp_path / "spool", "decode-0", ev, t0 + 2.001)
    hub, repo, c, committed = setup(migrated_url, tmp_path)

    async def body() -> None:
        for s in _ring(t0, 12):
            hub.emit(s)
        replay = _xid(t0 + 2.0005, replayed=True)
        hub.emit(replay)  # before the committer's task has read the intents
        assert c.opens_for(replay) == []
        await _until(lambda: committed)
        await asyncio.sleep(0.3)

    asyncio.run(_run(c, body))
    [row] = repo.list_snapshots(SnapshotFilter())[0]
    assert committed == [row["id"]] and repo.get_snapshot(row["id"]).summary.get("retaken")
    assert len([e for e in repo.list_events() if e["kind"] == "xid"]) == 1
    assert not intent.pending(tmp_path / "spool")
