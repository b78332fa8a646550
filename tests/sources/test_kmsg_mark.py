"""The kernel log resumes after its mark: what an earlier run read but did not make durable is
read again (replayed, the same event), what it handled is not; the mark waits for the writer."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from collector.model import Event, EventKind
from collector.sources import kmsg as kmsg_mod
from collector.sources.kmsg import KmsgSource
from collector.sources.kmsg_mark import MARK_FILE, Position, ResumeMark, keep_mark
from tests.sources.test_kmsg import FIXTURE, LINES, ListSink, append, run_with, until

BOOT = 1_000_000.0


class Barrier:
    """The writer's side, by hand: ``written`` is how many offered events are written."""

    def __init__(self) -> None:
        self.offered = 0
        self.written = 0

    def ticket(self) -> int:
        return self.offered

    def passed(self, ticket: int) -> bool:
        return self.written >= ticket


def _source(log: Path, mark: ResumeMark) -> KmsgSource:
    return KmsgSource(str(log), mode="path", poll_interval=0.01, host_boot_time=BOOT, mark=mark)


def test_a_file_is_read_again_after_the_mark_and_a_record_read_twice_is_the_same_event(tmp_path: Path) -> None:
    log, spool = tmp_path / "kern.log", tmp_path / "spool"
    log.write_text("\n".join(LINES[:6]) + "\n")  # up to the first Xid: there before the first start
    mark = ResumeMark(spool / MARK_FILE, source=str(log))
    first = _source(log, mark)
    barrier = Barrier()

    async def body(sink: ListSink) -> None:
        keeper = asyncio.create_task(keep_mark(first, barrier, every=0.01))
        await until(lambda: mark.saved is not None)  # the first start: from the end, its place saved at once
        assert sink.items == []
        barrier.offered += 1  # the Xid read next is offered to the writer...
        append(log, LINES[6])
        await until(lambda: len(sink.items) == 1)
        await asyncio.sleep(0.1)
        assert mark.saved is not None and mark.saved.offset == len("\n".join(LINES[:6])) + 1  # ...and not written: no move
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)

    live = run_with(first, body).items[0]
    assert live.xid == 31 and "replayed" not in live.data and live.ts != pytest.approx(BOOT + 34.043884)
    assert stat.S_IMODE((spool / MARK_FILE).stat().st_mode) == 0o600

    # killed there: the next start reads the Xid again, with the kernel's time, as the same event
    append(log, LINES[7])  # and one written while the sidecar was down
    again = run_with(_source(log, ResumeMark(spool / MARK_FILE, source=str(log))), lambda sink: until(lambda: len(sink.items) == 2))
    assert [(e.xid, e.pid) for e in again.items] == [(31, 444), (43, 467)]
    assert all(e.data["replayed"] for e in again.items)
    assert again.items[0].uid == live.uid  # read twice, one event: stored once, one snapshot
    assert again.items[0].ts == pytest.approx(BOOT + 34.043884)  # the fault's own time


def test_the_mark_moves_once_the_writer_has_the_events_and_is_saved_at_stop(tmp_path: Path) -> None:
    log, spool = tmp_path / "kern.log", tmp_path / "spool"
    log.write_text("")
    mark = ResumeMark(spool / MARK_FILE, source=str(log))
    src, barrier = _source(log, mark), Barrier()

    async def body(sink: ListSink) -> None:
        keeper = asyncio.create_task(keep_mark(src, barrier, every=0.01))
        await until(lambda: mark.saved is not None and mark.saved.offset == 0)
        append(log, LINES[5])
        barrier.offered += 1
        await until(lambda: len(sink.items) == 1)
        await asyncio.sleep(0.05)
        assert mark.saved.offset == 0
        barrier.written = 1  # the writer's flush wrote the Xid's row
        await until(lambda: mark.saved is not None and mark.saved.offset == len(LINES[5]) + 1)
        append(log, "an ordinary kernel line")  # no event: nothing to wait for
        await until(lambda: src.handled is not None and src.handled.offset == len(LINES[5]) + 25)
        keeper.cancel()  # the stop: the last place is saved
        await asyncio.gather(keeper, return_exceptions=True)

    run_with(src, body)
    saved = json.loads((spool / MARK_FILE).read_text())
    assert saved["offset"] == len(LINES[5]) + 25 and saved["source"] == str(log)
    assert ResumeMark(spool / MARK_FILE, source=str(log)).load() == src.handled


def test_a_file_replaced_while_stopped_is_read_from_its_start(tmp_path: Path) -> None:
    log, spool = tmp_path / "kern.log", tmp_path / "spool"
    log.write_text(LINES[5] + "\n")
    mark = ResumeMark(spool / MARK_FILE, source=str(log))
    st = log.stat()
    mark.save(Position(file=(st.st_dev, st.st_ino), offset=len(LINES[5]) + 1))
    os.rename(log, tmp_path / "kern.log.1")  # rotated while the sidecar was down
    log.write_text(LINES[7] + "\n")
    sink = run_with(_source(log, mark), lambda sink: until(lambda: len(sink.items) == 1))
    assert sink.items[0].pid == 467 and sink.items[0].data["replayed"]


def test_an_unreadable_or_foreign_mark_is_not_used(tmp_path: Path) -> None:
    p = tmp_path / MARK_FILE
    p.write_text("{not json")
    assert ResumeMark(p, source="/dev/kmsg").load() is None
    p.write_text(json.dumps({"source": "/var/log/kern.log", "seq": 5}))
    assert ResumeMark(p, source="/dev/kmsg").load() is None
    p.write_text(json.dumps({"source": "/dev/kmsg", "seq": "5"}))
    assert ResumeMark(p, source="/dev/kmsg").load() is None
    p.write_text(json.dumps({"source": "/dev/kmsg", "boot_id": "b", "seq": 5}))
    assert ResumeMark(p, source="/dev/kmsg").load() == Position(boot_id="b", seq=5)


# -- /dev/kmsg: records by sequence number, through a SOCK_SEQPACKET pair ---------------


def _kmsg(monkeypatch: pytest.MonkeyPatch, mark: ResumeMark, records: list[str]) -> tuple[KmsgSource, socket.socket]:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    for r in records:  # the kernel's buffer at the open
        kernel.send(r.encode())
    src = KmsgSource("/dev/kmsg", mode="on", poll_interval=0.01, host_boot_time=BOOT, mark=mark)
    fd = os.dup(ours.fileno())
    ours.close()
    monkeypatch.setattr(src, "_open_kmsg", lambda: fd)
    monkeypatch.setattr(kmsg_mod, "_boot_id", lambda: "boot-a")
    return src, kernel


def test_kmsg_skips_what_the_mark_covers_and_counts_what_the_buffer_overwrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = ResumeMark(tmp_path / MARK_FILE, source="/dev/kmsg")
    mark.save(Position(boot_id="boot-a", seq=357))
    # the buffer wrapped while the sidecar was down: it starts at 358 (no loss: 358 is next) ...
    src, kernel = _kmsg(monkeypatch, mark, LINES[3:7])  # seq 358..361

    async def body(sink: ListSink) -> None:
        await until(lambda: len(sink.items) == 2)
        kernel.send(LINES[7].encode())  # live
        await until(lambda: len(sink.items) == 3)

    sink = run_with(src, body)
    assert [(e.xid, e.data.get("replayed", False)) for e in sink.items] == [(43, True), (31, True), (43, False)]
    assert src.records_lost == 0 and src.handled == Position(boot_id="boot-a", seq=362)
    kernel.close()

    # ... and once it starts past the mark: the records in between are counted lost
    mark.save(Position(boot_id="boot-a", seq=355))
    src, kernel = _kmsg(monkeypatch, mark, LINES[5:7])  # 360, 361: 356-359 overwritten
    sink = run_with(src, lambda sink: until(lambda: len(sink.items) == 2))
    assert src.records_lost == 4
    kernel.close()


def test_kmsg_without_a_mark_or_of_another_boot_starts_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for saved in (None, Position(boot_id="boot-before-the-reboot", seq=10)):
        mark = ResumeMark(tmp_path / MARK_FILE, source="/dev/kmsg")
        (tmp_path / MARK_FILE).unlink(missing_ok=True)
        if saved is not None:
            mark.save(saved)
        src, kernel = _kmsg(monkeypatch, mark, LINES)

        async def body(sink: ListSink) -> None:
            await until(lambda: src.handled is not None and src.handled.seq == 362)
            await asyncio.sleep(0.05)

        sink = run_with(src, body)
        assert sink.items == [] and src.lines_read == 0  # the backlog skipped...
        assert src.uuids == {"0000:00:06.0": "GPU-00000000-1111-2222-3333-444444444444"}  # ...its UUIDs learnt
        kernel.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable here")
def test_the_real_dev_kmsg_resumes_after_its_mark(tmp_path: Path) -> None:
    """The kernel's own /dev/kmsg, read only: the first start skips the buffer and marks its last
    record; a mark three records back reads those three again."""
    mark = ResumeMark(tmp_path / MARK_FILE, source="/dev/kmsg")
    first = KmsgSource("/dev/kmsg", mode="on", poll_interval=0.01, mark=mark)
    run_with(first, lambda sink: until(lambda: first.handled is not None))
    assert first.handled is not None and first.handled.seq is not None and first.handled.boot_id
    skipped = first.lines_read  # records that came while it ran (usually none)
    mark.save(Position(boot_id=first.handled.boot_id, seq=first.handled.seq - 3))
    again = KmsgSource("/dev/kmsg", mode="on", poll_interval=0.01, mark=mark)

    async def body(sink: ListSink) -> None:
        await until(lambda: again.handled is not None and again.handled.seq >= first.handled.seq)  # type: ignore[union-attr]

    run_with(again, body)
    assert again.lines_read >= 3 + skipped and again.records_lost == 0


def test_an_event_read_twice_has_one_id_and_a_live_one_keeps_arrival_time() -> None:
    src = KmsgSource("/nonexistent", mode="path", host_boot_time=BOOT, clock=lambda: 5000.0)
    a = src.handle_record(LINES[5], place="kmsg:b:360")
    b = src.handle_record(LINES[5], place="kmsg:b:360", replayed=True)
    c = src.handle_record(LINES[5], place="kmsg:b:361")
    assert isinstance(a, Event) and isinstance(b, Event) and isinstance(c, Event)
    assert a.uid == b.uid != c.uid and len(a.uid) == 32
    assert a.ts == 5000.0 and b.ts == pytest.approx(BOOT + 28.939261) and b.kind is EventKind.XID
    assert FIXTURE.exists()


def test_the_first_position_is_saved_once_read_even_when_the_mark_keeper_started_first(tmp_path: Path) -> None:
    """The service starts the mark's keeper before the sources: the first start's position is
    still saved as soon as the source has read once, not a whole ``every`` later (a fault that
    comes next must be read again after a kill)."""
    log, spool = tmp_path / "kern.log", tmp_path / "spool"
    log.write_text("\n".join(LINES[:6]) + "\n")
    mark = ResumeMark(spool / MARK_FILE, source=str(log))
    src = _source(log, mark)

    async def main() -> None:
        keeper = asyncio.create_task(keep_mark(src, Barrier(), every=3600.0))  # before the source, and an hour apart
        await asyncio.sleep(0.05)
        reader = asyncio.create_task(src.run(ListSink()))
        try:
            await until(lambda: mark.saved is not None)
        finally:
            for t in (keeper, reader):
                t.cancel()
            await asyncio.gather(keeper, reader, return_exceptions=True)

    asyncio.run(main())
    assert mark.saved is not None and mark.saved.offset == len("\n".join(LINES[:6])) + 1
