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

``/dev/kmsg`` returns one whole record per ``read``. It is opened non-blocking, at its
end by default (``from_start=False``), and read when the event loop says it is readable
(``add_reader``), with a short poll as a fallback, so the loop never blocks. ``EPIPE``
means records were overwritten in the kernel's ring before we read them: we count the
loss and carry on with the next record.

Each Xid line becomes ``Event(kind=XID, source="kmsg")``; the fallen-off-the-bus line and
Xid 79 become ``Event(kind=GPU_LOST)``. ``NVRM: GPU at PCI:...: GPU-<uuid>`` lines teach
the source the UUID of each bus id, which later events carry in ``data["uuid"]``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
from collections.abc import Callable
from typing import Literal

from collector.model import Event, EventKind, Severity
from collector.sources.base import Sink, SourceError, SourceUnsupported
from collector.sources.follow import FileTail
from collector.xid.catalog import XidCatalog, default_catalog
from collector.xid.parser import GpuUuidRecord, XidParseError, XidRecord, parse_line

DEV_KMSG = "/dev/kmsg"
_READ_SIZE = 8192  # a kmsg record is at most about 1 KiB; one read returns one record


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
    ) -> None:
        self.path = path
        self.mode = mode
        self.from_start = from_start
        self.poll_interval = poll_interval
        self._clock = clock
        # Kernel stamps are microseconds since boot; with the boot time they become wall
        # time. Only replayed (from_start) records need it: live ones are stamped on arrival.
        self._boot_time = host_boot_time
        self._catalog = catalog or default_catalog()
        self.uuids: dict[str, str] = {}  # canonical bus id -> GPU UUID
        self.records_lost = 0  # kmsg records overwritten before we read them
        self.parse_errors = 0
        self.lines_read = 0

    # -- the one entry point ---------------------------------------------------------

    async def run(self, sink: Sink) -> None:
        if self.mode != "path" or _is_char_device(self.path):
            await self._follow_kmsg(sink)
        else:
            await self._follow_file(sink)

    # -- turning one record into events (pure apart from the uuid map) ---------------

    def handle_record(self, raw: str, *, replayed: bool = False) -> Event | None:
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
        return self._event(parsed, replayed=replayed)

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
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            reason = f"cannot read {self.path}: {exc.strerror or exc}"
            if self.mode == "auto":
                raise SourceUnsupported(reason) from exc
            raise SourceError(reason) from exc
        if not self.from_start:
            try:
                os.lseek(fd, 0, os.SEEK_END)  # kmsg: skip the backlog, read only new records
            except OSError:
                pass
        return fd

    async def _follow_kmsg(self, sink: Sink) -> None:
        fd = self._open_kmsg()
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        watching = False
        try:
            try:
                loop.add_reader(fd, ready.set)
                watching = True
            except (NotImplementedError, OSError, ValueError):
                pass  # no readiness for this fd: the poll below still reads it
            replayed = self.from_start
            while True:
                for record in self._drain_kmsg(fd):
                    event = self.handle_record(record, replayed=replayed)
                    if event is not None:
                        sink.emit(event)
                replayed = False
                ready.clear()
                try:
                    await asyncio.wait_for(ready.wait(), self.poll_interval)
                except TimeoutError:
                    pass
        finally:
            if watching:
                loop.remove_reader(fd)
            os.close(fd)

    def _drain_kmsg(self, fd: int) -> list[str]:
        out: list[str] = []
        for _ in range(10_000):  # bounded: a flood is read over several loop turns
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten in the ring: the next read goes on
                    self.records_lost += 1
                    continue
                if exc.errno == errno.EINVAL:  # a record larger than our buffer: skip it
                    self.parse_errors += 1
                    continue
                raise SourceError(f"reading {self.path}: {exc}") from exc
            if not chunk:
                break
            out.append(chunk.decode("utf-8", "replace"))
        return out

    # -- a plain file, followed like tail -F -------------------------------------------

    async def _follow_file(self, sink: Sink) -> None:
        follower = FileFollower(self.path, from_start=self.from_start)
        try:
            replayed = self.from_start
            while True:
                for line in follower.read_lines():
                    event = self.handle_record(line, replayed=replayed)
                    if event is not None:
                        sink.emit(event)
                replayed = False
                await asyncio.sleep(self.poll_interval)
        finally:
            follower.close()


class FileFollower(FileTail):
    """A kernel log written to a plain file (``kmsg: /var/log/kern.log``), followed like
    ``tail -F`` (see ``collector.sources.follow``)."""

    def __init__(self, path: str, *, from_start: bool = False) -> None:
        super().__init__(path, from_start=from_start)


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
