"""An open snapshot's life: each legal transition, and the illegal ones refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from collector.model import Event, EventKind, Severity
from collector.snapshot import intent
from collector.snapshot.lifecycle import Amendment, IllegalTransition, Life, OpenSnapshot, Stored


def event(uid: str = "t1", ts: float = 100.0, xid: int | None = None) -> Event:
    return Event(kind=EventKind.XID, ts=ts, source="test", message="Xid 79", severity=Severity.CRITICAL, engine="decode-0", uid=uid, xid=xid)


def opened(**kw: object) -> OpenSnapshot:
    return OpenSnapshot.opened("decode-0", event(), 130.0, gpu=None, run=1, **kw)  # type: ignore[arg-type]


def test_opened_is_pending_with_its_amendment_due() -> None:
    o = opened()
    assert o.life == Life(Stored.PENDING, Amendment.DUE)
    assert o.snapshot_id is None and not o.amended and not o.duplicate and o.committed is None  # no loop: nobody waits


def test_a_replayed_trigger_has_no_amendment() -> None:
    o = opened(replayed=True)
    assert o.life == Life(Stored.PENDING, Amendment.NONE) and o.amended
    with pytest.raises(IllegalTransition):
        o.take_amendment()


def test_join_while_the_window_is_open_and_not_after() -> None:
    o = opened()
    o.join(event("w1", xid=79), gpu="0000:06", now=120.0)
    assert [e.uid for e in o.late] == ["w1"] and o.gpus == {"0000:06"} and o.xids() == {79}
    with pytest.raises(IllegalTransition):
        o.join(event("w2"), gpu=None, now=130.0)  # closed at ``until``
    assert [e.uid for e in o.late] == ["w1"]


def test_first_commit_then_amendment() -> None:
    o = opened()
    o.take_amendment()
    assert o.life == Life(Stored.PENDING, Amendment.TAKEN) and o.amended
    o.commit_first(7)
    assert o.life == Life(Stored.COMMITTED, Amendment.TAKEN) and o.snapshot_id == 7
    o.commit_amendment(7)
    assert o.life == Life(Stored.COMMITTED, Amendment.TAKEN) and o.error == ""


def test_the_amendment_is_taken_once() -> None:
    o = opened()
    o.take_amendment()
    with pytest.raises(IllegalTransition):
        o.take_amendment()


def test_an_amendment_is_committed_only_after_the_first_version_and_its_taking() -> None:
    o = opened()
    with pytest.raises(IllegalTransition):
        o.commit_amendment(7)  # nothing committed yet
    o.commit_first(7)
    with pytest.raises(IllegalTransition):
        o.commit_amendment(7)  # the amendment is not taken
    o.take_amendment()
    with pytest.raises(IllegalTransition):
        o.commit_amendment(8)  # another snapshot's id
    with pytest.raises(IllegalTransition):
        o.commit_first(7)  # the first version is committed once


def test_found_stored_before_is_a_duplicate_and_takes_no_amendment() -> None:
    o = opened()
    o.found_stored(3)
    assert o.life.stored is Stored.DUPLICATE and o.duplicate and o.amended and o.snapshot_id == 3
    for illegal in (o.take_amendment, lambda: o.commit_first(3), lambda: o.found_stored(3), lambda: o.refuse("no")):
        with pytest.raises(IllegalTransition):
            illegal()


def test_refused_for_good_may_still_be_committed_by_its_amendment() -> None:
    o = opened()
    o.refuse("bad document")
    assert o.life.stored is Stored.REFUSED and o.error == "bad document"
    o.take_amendment()
    o.commit_first(9)
    assert o.life == Life(Stored.COMMITTED, Amendment.TAKEN) and o.error == ""


def test_a_refused_amendment_leaves_the_first_version_standing() -> None:
    o = opened()
    o.commit_first(4)
    o.take_amendment()
    o.refuse("too large")
    assert o.life.stored is Stored.COMMITTED and o.snapshot_id == 4 and o.error == "too large"


def test_a_waiting_request_gets_the_id_once_committed() -> None:
    async def main() -> asyncio.Future[int] | None:
        o = opened()
        assert o.committed is not None and not o.committed.done()
        o.commit_first(5)
        return o.committed

    fut = asyncio.run(main())
    assert fut is not None and fut.result() == 5


def test_the_ways_a_snapshot_starts_at_start(tmp_path: Path) -> None:
    amendment = OpenSnapshot.from_spool("e", event(), snapshot_id=2, spool_path=tmp_path / "a.spool", intent_path=None)
    assert amendment.life == Life(Stored.COMMITTED, Amendment.TAKEN)
    amendment.commit_amendment(2)
    first = OpenSnapshot.from_spool("e", event(), snapshot_id=None, spool_path=tmp_path / "b.spool", intent_path=None)
    assert first.life == Life(Stored.PENDING, Amendment.NONE) and first.amended
    it = intent.Intent(path=tmp_path / "t.intent", engine="e", accepted_at=1.0, event=event())
    retaken = OpenSnapshot.retaken(it)
    assert retaken.retake is it and retaken.intent_path == it.path and retaken.life == Life(Stored.PENDING, Amendment.NONE)


def test_fields_change_only_through_transitions(tmp_path: Path) -> None:
    o = opened()
    with pytest.raises(AttributeError):
        o.snapshot_id = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        o.until = 0.0
    o.spooled(tmp_path / "x.spool")
    assert o.spool_path == tmp_path / "x.spool"
    o.spool_removed(tmp_path / "other.spool")
    assert o.spool_path is not None
    o.spool_removed(tmp_path / "x.spool")
    assert o.spool_path is None
    o.spool_failed("disk full")
    assert o.spool_error == "disk full"
    o.intent_written(tmp_path / "t.intent")
    o.intent_removed()
    assert o.intent_path is None


def test_a_merged_witness_replaces_the_event_with_its_id() -> None:
    o = opened()
    o.join(event("w1"), gpu=None, now=101.0)
    merged = event("w1", xid=79)
    o.replace_witness(merged)
    assert o.late[0] is merged and o.xids() == {79}
