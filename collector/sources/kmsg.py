"""Kernel log source: NVIDIA Xid lines from ``/dev/kmsg`` or a followed log file.

The ``kmsg`` setting maps onto this source as follows (``kmsg_source_from_setting``):

==========  =====================================================================
``off``     no source.
``auto``    follow ``/dev/kmsg``; if it cannot be opened (no permission, not Linux)
            the source raises ``SourceUnsupported`` once and is reported unsupported.
``on``      follow ``/dev/kmsg``; if it cannot be opened that is an error
            (``SourceError``): reported down in the source status and retried.
a path      follow that path. A character device (``/dev/kmsg`` itself) is read as
            kmsg records; anything else as a text file, like ``tail -F``: it may not
            exist yet, and it survives truncation and rotation.
==========  =====================================================================

``/dev/kmsg`` returns one whole record per ``read``. It is opened non-blocking and read when
the event loop says it is readable (``add_reader``), with a short poll as a fallback, so the
loop never blocks.

Where reading starts: after the resume mark (``collector.sources.kmsg_mark``), the position up
to which an earlier run handled the log durably. ``/dev/kmsg`` is read from the start of the
kernel's buffer and the records up to the mark's sequence number are skipped (their GPU UUID
lines still teach the UUIDs); a followed file is read from the mark's byte offset (from its
start when it was replaced meanwhile). What comes after the mark is read again: faults the last
run read but did not make durable before it was killed, and faults written while it was down.
Those records are *replayed*: stamped with the kernel's own time (boot time plus the record's
microseconds) and marked ``data["replayed"]``, so their snapshot holds the rings at the fault.
Without a mark (the first start, another boot, another path) the log is read from its end,
as before: the backlog is skipped, its last position becomes the mark at once. ``from_start``
reads the whole log, replayed. A source restarted by its supervisor resumes where it was.

Each record's event gets an id made from its place (boot and sequence number, or file and
offset), so a record read twice is one event: its row is stored once and its snapshot's commit
is idempotent on it. The kernel's buffer may wrap: records overwritten before they were read
(while the sidecar was down, or ``EPIPE`` while it reads) show as a jump in the sequence numbers,
counted in ``records_lost`` and logged.

Each Xid line becomes ``Event(kind=XID, source="kmsg")``; the fallen-off-the-bus line and
Xid 79 become ``Event(kind=GPU_LOST)``. ``NVRM: GPU at PCI:...: GPU-<uuid>`` lines teach
the source the UUID of each bus id, which later events carry in ``data["uuid"]``.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from collector.model import Event, EventKind, Severity
from collector.sources.base import Sink, SourceError, SourceUnsupported
from collector.sources.kmsg_file import KernelLogFile
from collector.sources.kmsg_mark import Position, ResumeMark
from collector.ticks import next_tick, sleep_to_tick
from collector.xid.catalog import XidCatalog, default_catalog
from collector.xid.parser import GpuUuidRecord, XidParseError, XidRecord, parse_line, split_record

log = logging.getLogger(__name__)

DEV_KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_READ_SIZE = 8192  # a kmsg record is at most about 1 KiB; one read returns one record
WATCHED_POLL_S = 1.0  # /dev/kmsg read once a second besides when it says it is readable


class KmsgSource:
    name = "kmsg"

    def __init__(
        self,
        path: str = DEV_KMSG,
        *,
        mode: Literal["auto", "on", "path"] = "auto",
        from_start: bool = False,
        poll_interval: float = 0.25,
        clock: Callable[[], float] = time.time,
        host_boot_time: float | None = None,
        catalog: XidCatalog | None = None,
        mark: ResumeMark | None = None,
    ) -> None:
        self.path = path
        self.mode = mode
        self.from_start = from_start
        self.poll_interval = poll_interval
        self._clock = clock
        # Kernel stamps are microseconds since boot (the kernel's clock, which CLOCK_MONOTONIC
        # follows); with the boot time they become wall time. Only replayed records need it:
        # live ones are stamped on arrival.
        self._boot_time = time.time() - time.monotonic() if host_boot_time is None else host_boot_time
        self._catalog = catalog or default_catalog()
        self.mark = mark  # where an earlier run stopped; kept up to date by ``kmsg_mark.keep_mark``
        self.handled: Position | None = None  # every record up to here is handed to ingest
        self.uuids: dict[str, str] = {}  # canonical bus id -> GPU UUID
        self.records_lost = 0  # kmsg records overwritten before we read them
        self.parse_errors = 0
        self.lines_read = 0
        self.replayed = 0  # records read again after the mark (faults a restart owed)
        self.events = 0  # events handed to ingest (the mark waits for their rows when there are new ones)
        self._last_seq: int | None = None

    # -- the one entry point ---------------------------------------------------------

    async def run(self, sink: Sink) -> None:
        if self.mode != "path" or _is_char_device(self.path):
            await self._follow_kmsg(sink)
        else:
            await self._follow_file(sink)

    # -- turning one record into events (pure apart from the uuid map) ---------------

    def handle_record(self, raw: str, *, replayed: bool = False, place: str | None = None) -> Event | None:
        """One record; ``place`` names where it is in the log (the same each time it is read),
        and the event's id is made from it."""
        self.lines_read += 1
        try:
            parsed = parse_line(raw)
        except XidParseError:
            self.parse_errors += 1
            return None
        if parsed is None:
            return None
        if isinstance(parsed, GpuUuidRecord):
            self.uuids[parsed.bus_id] = parsed.uuid
            return None
        ev = self._event(parsed, replayed=replayed)
        if place is not None:
            ev.uid = hashlib.blake2b(place.encode("utf-8", "replace"), digest_size=16).hexdigest()
        if replayed:
            ev.data["replayed"] = True
            self.replayed += 1
        return ev

    def _learn_uuid(self, raw: str) -> None:
        """A record skipped (before the mark): only the UUID it may name is kept."""
        if "GPU-" not in raw:
            return
        try:
            parsed = parse_line(raw)
        except XidParseError:
            return
        if isinstance(parsed, GpuUuidRecord):
            self.uuids[parsed.bus_id] = parsed.uuid

    def _start(self) -> Position | None:
        """Where to resume: this run's own position (a restart by the supervisor), else the mark."""
        if self.handled is not None:
            return self.handled
        return self.mark.load() if self.mark is not None else None

    def _event(self, rec: XidRecord, *, replayed: bool) -> Event:
        info = self._catalog.lookup(rec.xid)
        severity = info.severity
        if rec.nvlink is not None:  # NVLink5 lines say themselves whether they are fatal
            severity = Severity.CRITICAL if rec.nvlink.fatal else Severity.WARNING
        if rec.gpu_lost:
            severity = Severity.CRITICAL
        ts = self._clock()
        usec = rec.record.usec
        if replayed and usec is not None and self._boot_time is not None:
            ts = self._boot_time + usec / 1e6
        data: dict[str, object] = {
            "name": rec.name,
            "channel": rec.channel,
            "detail": rec.detail,
            "kernel_usec": usec,
            "kernel_seq": rec.record.seq,
            "catalog": info.to_dict(),
        }
        if rec.bus_id is not None and rec.bus_id in self.uuids:
            data["uuid"] = self.uuids[rec.bus_id]
        if rec.nvlink is not None:
            data["nvlink"] = {
                "unit": rec.nvlink.unit,
                "fatal": rec.nvlink.fatal,
                "xc": rec.nvlink.xc,
                "instance": rec.nvlink.instance,
                "link": rec.nvlink.link,
                "words": list(rec.nvlink.words),
            }
        return Event(
            kind=EventKind.GPU_LOST if rec.gpu_lost else EventKind.XID,
            ts=ts,
            source="kmsg",
            message=rec.message,
            severity=severity,
            gpu=rec.bus_id,
            xid=rec.xid,
            pid=rec.pid,
            lines=[rec.message],
            data=data,
        )

    # -- /dev/kmsg ---------------------------------------------------------------------

    def _open_kmsg(self) -> int:
        """Opened at the start of the kernel's buffer: what to skip is decided by sequence number."""
        try:
            return os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            reason = f"cannot read {self.path}: {exc.strerror or exc}"
            if self.mode == "auto":
                raise SourceUnsupported(reason) from exc
            raise SourceError(reason) from exc

    async def _follow_kmsg(self, sink: Sink) -> None:
        boot = _boot_id()
        start = self._start()
        resume = start.seq if start is not None and start.seq is not None and start.boot_id == boot else None
        if start is not None and resume is None:
            log.info("the kernel log's resume mark is of another boot: reading /dev/kmsg from its end")
        fd = self._open_kmsg()
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        watching = False
        backlog = True  # reading what the buffer held at the open
        try:
            try:
                loop.add_reader(fd, ready.set)
                watching = True
            except (NotImplementedError, OSError, ValueError):
                pass  # no readiness for this fd: the poll below still reads it
            while True:
                records, caught_up = self._drain_kmsg(fd)
                for record in records:
                    seq = self._sequence(record, resume if backlog else None)
                    skip = backlog and not self.from_start and (resume is None or (seq is not None and seq <= resume))
                    if skip:
                        self._learn_uuid(record)
                    else:
                        # the place: this boot, and the record's header (priority, sequence number, time)
                        place = f"kmsg:{boot}:{record.split(';', 1)[0]}" if seq is not None else None
                        event = self.handle_record(record, replayed=backlog, place=place)
                        if event is not None:
                            sink.emit(event)
                            self.events += 1
                    if seq is not None:
                        self.handled = Position(boot_id=boot, seq=seq)
                if backlog and caught_up:
                    backlog = False
                    if resume is not None and (self._last_seq is None or self._last_seq < resume):
                        log.warning("the kernel log's resume mark (record %d) is ahead of the kernel's buffer: not used", resume)
                    if self.handled is None and self._last_seq is not None:
                        self.handled = Position(boot_id=boot, seq=self._last_seq)
                ready.clear()
                # readable wakes the loop (add_reader); the poll is for a device that never says
                # so: every poll_interval then, else once a second, on the loop's shared ticks
                period = WATCHED_POLL_S if watching else self.poll_interval
                try:
                    await asyncio.wait_for(ready.wait(), next_tick(loop.time(), period) - loop.time())
                except TimeoutError:
                    pass
        finally:
            if watching:
                loop.remove_reader(fd)
            os.close(fd)

    def _sequence(self, record: str, resume: int | None) -> int | None:
        """The record's sequence number; a jump past the one expected is records overwritten in
        the kernel's buffer before they were read (counted, logged)."""
        seq = split_record(record).seq
        if seq is None:
            return None
        expected = self._last_seq + 1 if self._last_seq is not None else (resume + 1 if resume is not None else None)
        if expected is not None and seq > expected:
            lost = seq - expected
            self.records_lost += lost
            log.warning(
                "%d kernel log record(s) were overwritten in the kernel's buffer before they were read (records %d-%d)%s",
                lost,
                expected,
                seq - 1,
                " while the sidecar was stopped" if self._last_seq is None else "",
            )
        self._last_seq = seq if self._last_seq is None else max(seq, self._last_seq)
        return seq

    def _drain_kmsg(self, fd: int) -> tuple[list[str], bool]:
        """The records readable now, and whether the buffer is read to its end."""
        out: list[str] = []
        for _ in range(10_000):  # bounded: a flood is read over several loop turns
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                return out, True
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten in the ring: the next read goes on (the seq jump counts it)
                    continue
                if exc.errno == errno.EINVAL:  # a record larger than our buffer: skip it
                    self.parse_errors += 1
                    continue
                raise SourceError(f"reading {self.path}: {exc}") from exc
            if not chunk:
                return out, True
            out.append(chunk.decode("utf-8", "replace"))
        return out, False

    # -- a plain file, followed like tail -F -------------------------------------------

    async def _follow_file(self, sink: Sink) -> None:
        start = self._start()
        place = (*start.file, start.offset) if start is not None and start.file is not None and start.offset is not None else None
        follower = KernelLogFile(self.path, start=place, from_start=self.from_start)
        resumed = place is not None or self.from_start
        try:
            while True:
                for line in follower.read():
                    replayed = resumed and line.file == follower.first_file and line.start < follower.backlog_end
                    event = self.handle_record(line.text, replayed=replayed, place=f"file:{line.file[0]}:{line.file[1]}:{line.start}:{line.text}")
                    if event is not None:
                        sink.emit(event)
                        self.events += 1
                at = follower.place()
                if at is not None:
                    self.handled = Position(file=(at[0], at[1]), offset=at[2])
                await sleep_to_tick(self.poll_interval)
        finally:
            follower.close()


def _boot_id() -> str | None:
    try:
        return Path(BOOT_ID).read_text().strip() or None
    except OSError:
        return None


def _is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return path == DEV_KMSG


def kmsg_source_from_setting(
    setting: str | bool,
    *,
    from_start: bool = False,
    poll_interval: float = 0.25,
    clock: Callable[[], float] = time.time,
    host_boot_time: float | None = None,
) -> KmsgSource | None:
    """The source the ``kmsg`` setting asks for, or None for ``off``.

    YAML reads a bare ``off``/``on`` as a boolean: both spellings are accepted.
    """
    if isinstance(setting, bool):
        setting = "on" if setting else "off"
    value = setting.strip()
    lowered = value.lower()
    if lowered in ("off", "false", "no", "0", ""):
        return None
    if lowered in ("auto", "on", "true", "yes", "1"):
        mode: Literal["auto", "on", "path"] = "auto" if lowered == "auto" else "on"
        path = DEV_KMSG
    else:
        mode, path = "path", value
    return KmsgSource(
        path,
        mode=mode,
        from_start=from_start,
        poll_interval=poll_interval,
        clock=clock,
        host_boot_time=host_boot_time,
    )
