"""The writer's barrier (``ticket``/``passed``), which the kernel log's resume mark waits for:
passed only once every event offered before the ticket is written."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from collector.model import Event, EventKind
from collector.storage.connect import StorageError, make_engine
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter


def _event(i: int) -> Event:
    return Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message=f"Xid {i}", xid=43, uid=f"{i:032x}")


def test_the_barrier_passes_once_the_events_before_it_are_written_and_not_while_the_database_is_down(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Repository(make_engine(migrated_url), host="node-a")
    w = BatchWriter(repo, interval=0.05, hold_s=0.0)
    assert w.passed(w.ticket())  # nothing offered: nothing to wait for

    async def body() -> None:
        w.offer_event(_event(1))
        ticket = w.ticket()
        assert not w.passed(ticket)
        real, down = repo.write_batch, [True]

        def write_batch(*a: Any, **kw: Any) -> None:
            if down[0]:
                raise StorageError("database unreachable")
            real(*a, **kw)

        monkeypatch.setattr(repo, "write_batch", write_batch)
        await w.flush()  # the database is down: given back, not written
        assert not w.passed(ticket)
        w.offer_event(_event(2))
        later = w.ticket()
        await w.flush()
        assert not w.passed(ticket)
        down[0] = False
        await w.flush()
        assert w.passed(ticket) and w.passed(later)

    asyncio.run(body())
    assert {e["uid"] for e in repo.list_events()} == {f"{1:032x}", f"{2:032x}"}


def test_an_event_taken_by_a_flush_still_writing_holds_the_barrier(migrated_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repository(make_engine(migrated_url), host="node-a")
    w = BatchWriter(repo, interval=0.05, hold_s=0.0)
    real = repo.write_batch
    slow = asyncio.Event()

    async def body() -> None:
        loop = asyncio.get_running_loop()

        def write_batch(*a: Any, **kw: Any) -> None:
            asyncio.run_coroutine_threadsafe(slow.wait(), loop).result(5)
            real(*a, **kw)

        monkeypatch.setattr(repo, "write_batch", write_batch)
        w.offer_event(_event(1))
        ticket = w.ticket()
        first = asyncio.create_task(w.flush())
        await asyncio.sleep(0.05)
        await w.flush()  # nothing left to take, but the first flush still writes event 1
        assert not w.passed(ticket)
        slow.set()
        await first
        assert w.passed(ticket)

    asyncio.run(body())


class _Witnesses(dict):  # type: ignore[type-arg]
    """An event's ``witnesses``: its walk off the loop thread stops after the first item until
    released, so the loop can merge a second witness into it meanwhile (deterministically)."""

    def __init__(self, loop_thread: int, *a: Any) -> None:
        super().__init__(*a)
        self.loop_thread = loop_thread
        self.reached = threading.Event()
        self.release = threading.Event()

    def items(self) -> Any:
        it = iter(dict.items(self))
        yield next(it)
        if threading.get_ident() != self.loop_thread and not self.reached.is_set():
            self.reached.set()
            self.release.wait(5.0)
        yield from it


def test_a_witness_merged_while_the_writer_writes_its_event_loses_no_row(migrated_url: str) -> None:
    """The writer's batch (steps, events) was lost when a second witness of an Xid was merged into
    the event while the writer's thread walked its data."""
    repo = Repository(make_engine(migrated_url), host="node-a")
    w = BatchWriter(repo, interval=0.05, hold_s=0.0)

    async def body() -> None:
        witnesses = _Witnesses(threading.get_ident(), {"kmsg": time.time()})
        ev = _event(1)
        ev.data["witnesses"] = witnesses
        w.offer_event(ev)
        flush = asyncio.create_task(w.flush())
        for _ in range(100):  # the writer's thread is in the walk (never, once it walks on the loop)
            if witnesses.reached.is_set() or flush.done():
                break
            await asyncio.sleep(0.01)
        witnesses.setdefault("nvml", time.time())  # XidMerger: NVML's report of the same fault
        witnesses.release.set()
        await flush

    asyncio.run(body())
    assert [e["uid"] for e in repo.list_events()] == [f"{1:032x}"]
    assert w.passed(1)
