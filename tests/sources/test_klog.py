"""The kernel log through syslog(2) (kmsg: syslog): new lines found by their stamps, a ring
that turned over, Xid lines becoming the same events as /dev/kmsg's, and the real system call
on this machine (a marker line written to the kernel log is read back)."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from collector.model import Event, EventKind
from collector.settings import load_settings
from collector.sources.base import SourceError, SourceUnsupported
from collector.sources.klog import KlogSource, klogctl_read_all, new_lines
from collector.sources.registry import BUILDERS

XID = "[ 5123.456789] NVRM: Xid (PCI:0000:3b:00): 43, pid=2931, name=python3, Ch 00000008"


def key(line: str) -> tuple[int, str]:
    from collector.sources.klog import _key

    return _key(line)


def test_new_lines_after_the_last_one_seen() -> None:
    ring = ["[ 1.000000] a", "[ 2.000000] b", "[ 2.000000] b", "[ 3.000000] c"]
    assert new_lines(ring, None) == (ring, False)
    # the key is the last line of the previous read; of equal lines, the newest one is it
    assert new_lines(ring, key(ring[2])) == (ring[3:], False)
    assert new_lines(ring, key(ring[0])) == (ring[1:], False)
    assert new_lines(ring, key(ring[-1])) == ([], False)
    # the ring turned over past the last line seen: what is newer, and a loss
    assert new_lines(["[ 9.000000] x", "[10.000000] y"], key("[ 3.000000] c")) == (["[ 9.000000] x", "[10.000000] y"], True)
    # no stamps (printk.time=0): by text
    assert new_lines(["a", "b", "c"], key("b")) == (["c"], False)
    assert new_lines(["d"], key("b")) == (["d"], True)


def test_xid_lines_become_events_and_old_ones_are_not_news() -> None:
    rings = iter(["<4>[ 1.0] old line\n", f"<4>[ 1.0] old line\n<3>{XID}\n", f"<4>[ 1.0] old line\n<3>{XID}\n"])
    got: list[Event] = []

    class Sink:
        def emit(self, item: object) -> None:
            assert isinstance(item, Event)
            got.append(item)

    src = KlogSource(reader=lambda: next(rings), poll_interval=0.01)

    async def main() -> None:
        task = asyncio.create_task(src.run(Sink()))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if src.polls >= 3:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    [ev] = got
    assert (ev.kind, ev.xid, ev.gpu, ev.source) == (EventKind.XID, 43, "0000:3b:00.0", "kmsg")


def test_a_ring_that_turned_over_between_two_reads() -> None:
    rings = iter(["<6>[ 1.000000] a\n<6>[ 2.000000] b\n", f"<6>[ 3.000000] c\n<3>{XID}\n", f"<6>[ 3.000000] c\n<3>{XID}\n<6>[6000.000000] d\n"])
    got: list[object] = []
    src = KlogSource(reader=lambda: next(rings))
    sink = type("S", (), {"emit": lambda s, i: got.append(i)})()
    src.poll(sink)  # a, b (the first read of a poll() is handled: from_start semantics)
    assert src.poll(sink) == 2 and src.records_lost == 1  # b is gone: c and the Xid are newer, some may be lost
    assert src.poll(sink) == 1 and src.records_lost == 1  # the fast path: only d
    assert [e.xid for e in got] == [43]  # type: ignore[attr-defined]


def test_refused_is_unsupported_or_an_error() -> None:
    def refused() -> str:
        raise PermissionError(1, "Operation not permitted")

    with pytest.raises(SourceUnsupported, match="CAP_SYSLOG"):
        asyncio.run(KlogSource(reader=refused).run(type("S", (), {"emit": lambda s, i: None})()))
    with pytest.raises(SourceError, match="CAP_SYSLOG"):
        asyncio.run(KlogSource(reader=refused, required=True).run(type("S", (), {"emit": lambda s, i: None})()))


def test_the_setting_selects_it() -> None:
    [src] = BUILDERS["kmsg"](load_settings(kmsg="syslog"))
    assert isinstance(src, KlogSource) and src.required


def test_the_real_system_call_reads_a_line_written_to_the_kernel_log() -> None:
    try:
        before = klogctl_read_all()
    except OSError as exc:
        pytest.skip(f"syslog(2) not allowed here: {exc}")
    assert before.strip(), "the kernel log is empty"
    if not os.access("/dev/kmsg", os.W_OK):
        pytest.skip("cannot write a marker to /dev/kmsg")
    src = KlogSource()
    src.poll(type("S", (), {"emit": lambda s, i: None})())
    marker = f"flightrec test marker {uuid.uuid4()} (not an Xid)"
    with open("/dev/kmsg", "w") as fh:
        fh.write(marker + "\n")
    seen: list[str] = []
    orig = src.records.handle_record
    src.records.handle_record = lambda raw, **kw: seen.append(raw) or orig(raw, **kw)  # type: ignore[method-assign]
    assert src.poll(type("S", (), {"emit": lambda s, i: None})()) >= 1
    assert any(marker in line for line in seen), seen[-3:]
    seen.clear()
    src.poll(type("S", (), {"emit": lambda s, i: None})())
    assert not any(marker in line for line in seen)  # read once, not again


def test_it_resumes_after_the_mark_of_this_boot(tmp_path) -> None:
    from collector.sources.kmsg_mark import Position, ResumeMark, keep_mark

    uuid_line = "<6>[ 1.000000] NVRM: GPU at PCI:0000:3b:00: GPU-5c1e3a5e-9a7b-4f0e-8a6f-1d2c3b4a5e6f\n"
    ring = f"{uuid_line}<6>[ 2.000000] before the mark\n<3>{XID}\n<6>[6000.000000] after\n"
    mark = ResumeMark(tmp_path / "kmsg.mark", source="syslog(2)")
    mark.save(Position(boot_id="boot-a", seq=2_000_000))  # the last run handled up to 2.0 s
    got: list[Event] = []
    sink = type("S", (), {"emit": lambda s, i: got.append(i)})()

    async def main(src: KlogSource) -> None:
        task = asyncio.create_task(src.run(sink))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    src = KlogSource(reader=lambda: ring, mark=mark, boot_id=lambda: "boot-a", poll_interval=0.01)
    asyncio.run(main(src))
    [ev] = got
    assert (
        ev.xid == 43 and ev.data.get("replayed") is True and ev.data.get("uuid") == "GPU-5c1e3a5e-9a7b-4f0e-8a6f-1d2c3b4a5e6f"
    )  # the skipped line still taught the UUID
    assert src.handled == Position(boot_id="boot-a", seq=6_000_000_000) and src.events == 1
    # read again (another restart before the mark moved): the same event, by its id
    again: list[Event] = []
    src2 = KlogSource(reader=lambda: ring, mark=mark, boot_id=lambda: "boot-a", poll_interval=0.01)
    sink2 = type("S", (), {"emit": lambda s, i: again.append(i)})()
    src2._boot = "boot-a"
    src2._handle(sink2, ring, after_usec=2_000_000)
    assert [e.uid for e in again] == [ev.uid]
    # another boot's mark: the ring is not news
    other: list[Event] = []
    src3 = KlogSource(reader=lambda: ring, mark=mark, boot_id=lambda: "boot-b", poll_interval=0.01)
    task_sink = type("S", (), {"emit": lambda s, i: other.append(i)})()

    async def main3() -> None:
        task = asyncio.create_task(src3.run(task_sink))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main3())
    assert other == []

    # the service's keep_mark saves this source's position once its events are written
    class Barrier:
        def ticket(self) -> int:
            return 1

        def passed(self, ticket: int) -> bool:
            return True

    async def keep() -> None:
        task = asyncio.create_task(keep_mark(src, Barrier(), every=0.01))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(keep())
    assert ResumeMark(tmp_path / "kmsg.mark", source="syslog(2)").load() == Position(boot_id="boot-a", seq=6_000_000_000)
