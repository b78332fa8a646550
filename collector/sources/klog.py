"""The kernel log through ``syslog(2)`` (``kmsg: syslog``): the same ring ``/dev/kmsg`` reads,
for a container that may not open that device.

Why: in an unprivileged container the runtime's device cgroup refuses ``open("/dev/kmsg")``
(EPERM) even when a hostPath mounts it, since ``/dev/kmsg`` (char 1:11) is not among the
devices a container may use; only ``privileged: true`` lifts that, which gives far more than
the log. ``syslog(SYSLOG_ACTION_READ_ALL)`` is a system call, not a device: it needs
``CAP_SYSLOG`` when ``kernel.dmesg_restrict`` is 1 (most distributions) and nothing when it
is 0, and the runtimes' default seccomp profiles allow it to a holder of ``CAP_SYSLOG``. The
kernel log is not namespaced: a container reads the node's.

``READ_ALL`` copies the whole ring (``SYSLOG_ACTION_SIZE_BUFFER`` bytes, 128 KiB to a few MiB)
without consuming it, so the source polls it every ``poll_interval`` and hands on the lines
after the last one it handed on, found by their ``[seconds.micros]`` stamp (and, for lines of
one stamp, their count). A ring that turned over between two polls (the last line seen is no
longer in it) is counted in ``records_lost``. Lines are the ``/dev/kmsg`` source's records
(``KmsgSource.handle_record``: Xid and fallen-off-the-bus events, UUID lines); a line without a
stamp (``printk.time=0``) is compared by its text.

It resumes like the ``/dev/kmsg`` source (``collector.sources.kmsg_mark``): its position is the
boot and the stamp, in microseconds, of the last line handled (``syslog(2)`` gives no sequence
numbers); at start, the lines after a mark of this boot are read again (``replayed``), those up
to it skipped but for the GPU UUIDs they teach; and an event's id is made from the line's boot,
stamp and text, so a line read twice is one event.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import functools
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from collector.sources.base import Sink, SourceError, SourceUnsupported
from collector.sources.kmsg import KmsgSource
from collector.sources.kmsg_mark import Position, ResumeMark

SYSLOG_ACTION_READ_ALL = 3
SYSLOG_ACTION_SIZE_BUFFER = 10
_PRIO = re.compile(r"^<\d{1,3}>")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
SOURCE = "syslog(2)"  # the mark's source: the kernel ring read through the system call
_STAMP = re.compile(r"^\[\s*(\d{1,12})\.(\d{1,9})\]")

Reader = Callable[[], str]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def klogctl_read_all() -> str:
    """The kernel's log ring, as ``dmesg -r`` prints it. Raises ``PermissionError`` without
    ``CAP_SYSLOG`` (dmesg_restrict) or when seccomp refuses the call, ``OSError`` otherwise."""
    libc = _libc()
    size = libc.klogctl(SYSLOG_ACTION_SIZE_BUFFER, None, 0)
    if size < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syslog(SIZE_BUFFER): {os.strerror(err)}")
    buf = ctypes.create_string_buffer(max(size, 1))
    n = libc.klogctl(SYSLOG_ACTION_READ_ALL, buf, size)
    if n < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syslog(READ_ALL): {os.strerror(err)}")
    return buf.raw[:n].decode("utf-8", "replace")


def _key(line: str) -> tuple[int, str]:
    """A line's place in the log: its stamp in microseconds (0 without one) and its text."""
    m = _STAMP.match(line)
    usec = int(m.group(1)) * 1_000_000 + int((m.group(2) + "000000")[:6]) if m else 0
    return usec, line


def new_lines(ring: list[str], last: tuple[int, str] | None) -> tuple[list[str], bool]:
    """The lines of ``ring`` after ``last`` (the key of the last line handed on), and whether
    the ring turned over past it (lines may have been lost). Pure."""
    if last is None:
        return ring, False
    for i in range(len(ring) - 1, -1, -1):
        if _key(ring[i]) == last:
            return ring[i + 1 :], False
    if last[0]:
        newer = [ln for ln in ring if _key(ln)[0] > last[0]]
        return newer, bool(ring) and _key(ring[0])[0] > last[0]
    return ring, True


class KlogSource:
    name = "kmsg"

    def __init__(
        self,
        *,
        required: bool = False,
        from_start: bool = False,
        poll_interval: float = 0.25,
        reader: Reader = klogctl_read_all,
        clock: Callable[[], float] = time.time,
        mark: ResumeMark | None = None,
        boot_id: Callable[[], str | None] | None = None,
    ) -> None:
        self.required = required
        self.from_start = from_start
        self.poll_interval = poll_interval
        self.reader = reader
        # the /dev/kmsg source's record handling: one parser, one set of events
        self.records = KmsgSource(SOURCE, mode="path", clock=clock)
        self.path = SOURCE  # the resume mark's source
        self.mark = mark  # where an earlier run stopped; kept up to date by ``kmsg_mark.keep_mark``
        self.handled: Position | None = None  # every line up to here is handed to ingest
        self.events = 0  # events handed to ingest
        self._boot_id = boot_id or _boot_id
        self._boot: str | None = None
        self.records_lost = 0  # polls that found the ring turned over past the last line
        self.polls = 0
        self._last: tuple[int, str] | None = None
        self._last_raw: str | None = None

    @property
    def lines_read(self) -> int:
        return self.records.lines_read

    def _read(self) -> str:
        self.polls += 1
        return self.reader()

    def _lines(self, text: str) -> list[str]:
        return [_PRIO.sub("", ln) for ln in text.splitlines() if ln.strip()]

    def _new(self, text: str) -> tuple[list[str], bool]:
        """The lines of ``text`` after the last one handed on, and whether some may be lost.

        Fast path: the last line seen, found in the ring's text by one search from its end (C
        speed), leaves only the text after it to split and parse; a ring of a few MiB costs a
        copy and a search per poll, not a parse of every line. Otherwise (first read, the ring
        turned over past that line) every line is compared by ``new_lines``."""
        last = self._last_raw
        if last:
            at = text.rfind("\n" + last + "\n")
            start = at + 1 if at >= 0 else (0 if text.startswith(last + "\n") else -1)
            if start >= 0:
                return self._lines(text[start + len(last) + 1 :]), False
        return new_lines(self._lines(text), self._last)

    def poll(self, sink: Sink) -> int:
        """One read of the ring, its new lines handled (tests, one-shot tools)."""
        return self._handle(sink, self._read())

    def _handle(self, sink: Sink, text: str, *, skip: bool = False, after_usec: int | None = None) -> int:
        """Hand on the new lines (all of them skipped with ``skip``, as their UUIDs only; with
        ``after_usec``, the lines stamped after it as ``replayed`` and those before skipped)."""
        fresh, lost = self._new(text)
        if lost:
            self.records_lost += 1
        for line in fresh:
            usec = _key(line)[0]
            if skip or (after_usec is not None and usec <= after_usec):
                self.records._learn_uuid(line)
                continue
            event = self.records.handle_record(line, replayed=after_usec is not None, place=f"{SOURCE}:{self._boot}:{line}")
            if event is not None:
                self.events += 1
                sink.emit(event)
        self._remember(text)
        if self._last is not None and self._last[0]:
            self.handled = Position(boot_id=self._boot, seq=self._last[0])
        return 0 if skip else len(fresh)

    def _remember(self, text: str) -> None:
        """The ring's last line, raw (for the fast path) and as a key (for the slow one)."""
        end = len(text.rstrip("\n"))
        if end == 0:
            return
        raw = text[text.rfind("\n", 0, end) + 1 : end]
        if raw.strip():
            self._last_raw = raw
            self._last = _key(_PRIO.sub("", raw))

    async def run(self, sink: Sink) -> None:
        try:
            text = await asyncio.to_thread(self._read)
        except OSError as exc:
            denied = exc.errno in (errno.EPERM, errno.EACCES)
            msg = f"syslog(2): {exc}" + (": no CAP_SYSLOG (kernel.dmesg_restrict=1), or seccomp refuses syslog(2)" if denied else "")
            if self.required:
                raise SourceError(msg) from exc
            raise SourceUnsupported(msg) from exc
        self._boot = self._boot_id()
        resume = self.handled or (self.mark.load() if self.mark is not None else None)
        if resume is not None and resume.boot_id == self._boot and resume.seq is not None:
            # after a restart: what the last run may not have made durable is read again
            self._handle(sink, text, after_usec=resume.seq)
        else:
            # what is already in the ring is not news, unless asked for (kmsg_from_start)
            self._handle(sink, text, skip=not self.from_start)
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                text = await asyncio.to_thread(self._read)
            except OSError as exc:
                raise SourceError(f"syslog(2): {exc}") from exc
            self._handle(sink, text)


def _boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None
