"""The kernel log source: a followed file (appended, truncated, rotated), kmsg records, settings."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from collector.model import Event, EventKind, Severity
from collector.sources import kmsg as kmsg_mod
from collector.sources.base import SourceError, SourceUnsupported
from collector.sources.kmsg import KmsgSource, kmsg_source_from_setting
from collector.sources.kmsg_file import KernelLogFile

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kmsg-h200-xid.txt"
LINES = FIXTURE.read_text().splitlines()
XID43 = "4,360,28939261,c;NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3, channel 0x0000000a"


class ListSink:
    def __init__(self) -> None:
        self.items: list[Event] = []

    def emit(self, item: object) -> None:
        assert isinstance(item, Event)
        self.items.append(item)


async def until(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def run_with(source: KmsgSource, body: Callable[[ListSink], Awaitable[None]]) -> ListSink:
    sink = ListSink()

    async def main() -> None:
        task = asyncio.create_task(source.run(sink))
        try:
            await body(sink)
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    asyncio.run(main())
    return sink


def append(path: Path, *lines: str) -> None:
    with path.open("a") as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_fixture_replayed_from_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(FIXTURE.read_text())
    src = KmsgSource(str(log), mode="path", from_start=True, poll_interval=0.01, host_boot_time=1_000_000.0)

    async def body(sink: ListSink) -> None:
        await until(lambda: len(sink.items) == 3)

    sink = run_with(src, body)
    assert [(e.kind, e.xid, e.pid, e.gpu) for e in sink.items] == [
        (EventKind.XID, 43, 415, "0000:00:06.0"),
        (EventKind.XID, 31, 444, "0000:00:06.0"),
        (EventKind.XID, 43, 467, "0000:00:06.0"),
    ]
    first = sink.items[0]
    assert first.source == "kmsg" and first.severity is Severity.WARNING
    assert first.data["uuid"] == "GPU-00000000-1111-2222-3333-444444444444"  # learnt from the line before
    assert first.data["catalog"]["code"] == 43 and first.data["name"] == "python3"
    assert first.ts == pytest.approx(1_000_000.0 + 28.939261)  # replayed: boot time + kernel stamp
    assert first.message == LINES[5].split(";", 1)[1]


def test_follow_starts_at_end_then_sees_appends(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID43 + "\n")  # old: not reported
    clock_value = 5000.0
    src = KmsgSource(str(log), mode="path", poll_interval=0.01, clock=lambda: clock_value)

    async def body(sink: ListSink) -> None:
        await asyncio.sleep(0.05)
        append(log, "garbage \x00\xff line", "NVRM: Xid (PCI:0000:00:06)", LINES[6])
        await until(lambda: len(sink.items) == 1)

    sink = run_with(src, body)
    assert sink.items[0].xid == 31 and sink.items[0].ts == 5000.0  # live lines: stamped on arrival
    assert src.parse_errors == 1


def test_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    src = KmsgSource(str(log), mode="path", poll_interval=0.01)

    async def body(sink: ListSink) -> None:
        await asyncio.sleep(0.03)
        with log.open("a") as fh:
            fh.write(XID43[:40])
        await asyncio.sleep(0.05)
        assert sink.items == []
        with log.open("a") as fh:
            fh.write(XID43[40:] + "\n")
        await until(lambda: len(sink.items) == 1)

    sink = run_with(src, body)
    assert sink.items[0].pid == 415


def test_truncation_and_rotation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x" * 500 + "\n")
    src = KmsgSource(str(log), mode="path", poll_interval=0.01)

    async def body(sink: ListSink) -> None:
        await asyncio.sleep(0.03)
        log.write_text(LINES[5] + "\n")  # truncated in place to something shorter
        await until(lambda: len(sink.items) == 1)
        append(log, LINES[6])  # last line of the old file, written just before rotation
        os.rename(log, tmp_path / "kern.log.1")
        log.write_text(LINES[7] + "\n")  # the new file
        await until(lambda: len(sink.items) == 3)

    sink = run_with(src, body)
    assert [e.pid for e in sink.items] == [415, 444, 467]


def test_missing_file_is_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    src = KmsgSource(str(log), mode="path", poll_interval=0.01)

    async def body(sink: ListSink) -> None:
        await asyncio.sleep(0.03)
        log.write_text(XID43 + "\n")  # a file that appears later is read from its start
        await until(lambda: len(sink.items) == 1)

    assert run_with(src, body).items[0].xid == 43


def test_file_lines_come_whole_with_their_place_in_the_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"a\n\xffb\nc")
    f = KernelLogFile(str(p), from_start=True)
    got = f.read()
    assert [(x.start, x.end, x.text) for x in got] == [(0, 2, "a"), (2, 5, "\ufffdb")]  # offsets in bytes
    st = p.stat()
    assert got[0].file == (st.st_dev, st.st_ino) and f.place() == (st.st_dev, st.st_ino, 5)
    append(p, "")  # completes "c"
    assert [(x.start, x.text) for x in f.read()] == [(5, "c")]
    assert f.place() == (st.st_dev, st.st_ino, 7)
    f.close()
    again = KernelLogFile(str(p), start=(st.st_dev, st.st_ino, 2))  # where an earlier run stopped
    assert [x.text for x in again.read()] == ["\ufffdb", "c"] and again.resumed


def test_fallen_off_the_bus_is_gpu_lost() -> None:
    src = KmsgSource("/nonexistent", mode="path")
    ev = src.handle_record("3,1200,5000000,-;NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.")
    assert ev is not None and ev.kind is EventKind.GPU_LOST and ev.severity is Severity.CRITICAL
    assert (ev.xid, ev.gpu) == (79, "0000:3b:00.0")


def test_nvlink_fatality_sets_severity() -> None:
    src = KmsgSource("/nonexistent", mode="path")
    line = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP {} XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)"
    fatal = src.handle_record(line.format("Fatal"))
    nonfatal = src.handle_record(line.format("Nonfatal"))
    assert fatal is not None and fatal.severity is Severity.CRITICAL and fatal.data["nvlink"]["unit"] == "RLW_REMAP"
    assert nonfatal is not None and nonfatal.severity is Severity.WARNING


# -- /dev/kmsg semantics, through a SOCK_SEQPACKET pair: one record per read, pollable ----


def test_kmsg_records_read_whole_and_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    src = KmsgSource("/dev/kmsg", mode="on", poll_interval=5.0)  # a long poll: readiness must wake it
    monkeypatch.setattr(src, "_open_kmsg", lambda: os.dup(ours.fileno()))

    async def body(sink: ListSink) -> None:
        await asyncio.sleep(0.05)
        t0 = asyncio.get_running_loop().time()
        for line in LINES:
            kernel.send((line + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:00:06.0").encode())
        await until(lambda: len(sink.items) == 3)
        assert asyncio.get_running_loop().time() - t0 < 1.0

    sink = run_with(src, body)
    assert [e.xid for e in sink.items] == [43, 31, 43]
    assert sink.items[0].data["kernel_seq"] == 360
    ours.close()
    kernel.close()


def test_kmsg_overwritten_records_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    src = KmsgSource("/dev/kmsg", mode="on")
    script: list[bytes | int] = [XID43.replace(",360,", ",356,").encode(), errno.EPIPE, XID43.encode(), errno.EAGAIN]

    def fake_read(fd: int, n: int) -> bytes:
        item = script.pop(0)
        if isinstance(item, int):
            if item == errno.EAGAIN:
                raise BlockingIOError(item, "again")
            raise OSError(item, os.strerror(item))
        return item

    monkeypatch.setattr(kmsg_mod.os, "read", fake_read)
    records, caught_up = src._drain_kmsg(99)
    assert caught_up and len(records) == 2
    assert [src._sequence(r, None) for r in records] == [356, 360]
    assert src.records_lost == 3  # 357-359: the sequence numbers jumped past them


def test_unreadable_kmsg_auto_is_unsupported_on_is_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-kmsg")
    with pytest.raises(SourceUnsupported):
        asyncio.run(KmsgSource(missing, mode="auto").run(ListSink()))
    with pytest.raises(SourceError) as info:
        asyncio.run(KmsgSource(missing, mode="on").run(ListSink()))
    assert not isinstance(info.value, SourceUnsupported)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("off", None),
        (False, None),
        ("auto", ("/dev/kmsg", "auto")),
        ("on", ("/dev/kmsg", "on")),
        (True, ("/dev/kmsg", "on")),
        ("/var/log/kern.log", ("/var/log/kern.log", "path")),
    ],
)
def test_setting_mapping(setting: str | bool, expected: tuple[str, str] | None) -> None:
    src = kmsg_source_from_setting(setting)
    if expected is None:
        assert src is None
    else:
        assert src is not None and (src.path, src.mode) == expected
