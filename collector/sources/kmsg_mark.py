"""The kernel log's resume mark: how far the kernel log is handled durably, kept on disk so that
a restarted sidecar reads again what it had read but not yet made durable.

A fault read from the kernel log is durable once its event row is written or its trigger's
intent is on disk (``collector.snapshot.intent``). The intent is written while the record is
handed to ingest (the trigger policy runs inside ``emit``, on the loop); the event row later,
by the batching writer. So the mark moves to a position only when every event handed to
ingest up to it is written: ``keep_mark`` notes the source's position and the writer's count of
events offered (``Barrier.ticket``), waits until the writer has written them all
(``Barrier.passed``), and then saves the position. A kill anywhere before that leaves the older
mark, and the next start reads the record again; a record read again is the same event (its id
is made from its place in the log), so what did become durable is not stored twice.

The position: for ``/dev/kmsg``, the boot (``/proc/sys/kernel/random/boot_id``) and the sequence
number of the last record handled; for a followed file, its device, inode and byte offset. One
small JSON file, written atomically, fsynced and owner-only (``collector.durable``), beside the
spool: ``kmsg.mark``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from collector import durable
from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)

MARK_FILE = "kmsg.mark"
_MAX_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Position:
    """How far a kernel log is handled: ``/dev/kmsg``'s record number within one boot, or a
    followed file's byte offset within one file (device, inode)."""

    boot_id: str | None = None
    seq: int | None = None
    file: tuple[int, int] | None = None
    offset: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "boot_id": self.boot_id,
            "seq": self.seq,
            "dev": self.file[0] if self.file else None,
            "ino": self.file[1] if self.file else None,
            "offset": self.offset,
        }


class ResumeMark:
    """The mark of the kernel log at ``source`` (its path), in the file ``path``."""

    def __init__(self, path: Path, *, source: str) -> None:
        self.path = Path(path)
        self.source = source
        self.saved: Position | None = None
        self.error = ""  # why the last save failed ("" once one succeeds)

    def load(self) -> Position | None:
        """The saved position; None when there is none, it is another log's, or unreadable."""
        try:
            data = self.path.read_bytes()[:_MAX_SIZE]
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read the kernel log's resume mark %s (%s): reading the log from its end", self.path, exc)
            return None
        try:
            doc = json.loads(data)
            if doc.get("source") != self.source:
                log.info("the kernel log's resume mark is of %s, not %s: not used", doc.get("source"), self.source)
                return None
            dev, ino = doc.get("dev"), doc.get("ino")
            pos = Position(
                boot_id=_opt_str(doc.get("boot_id")),
                seq=_opt_int(doc.get("seq")),
                file=(int(dev), int(ino)) if dev is not None and ino is not None else None,
                offset=_opt_int(doc.get("offset")),
            )
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            log.warning("the kernel log's resume mark %s is unreadable (%s): reading the log from its end", self.path, exc)
            return None
        self.saved = pos
        return pos

    def save(self, pos: Position) -> None:
        """Atomic and durable; raises OSError (disk full, no permission) for the caller."""
        body = json.dumps({"version": 1, "source": self.source, **pos.to_dict(), "saved_at": time.time()}).encode() + b"\n"
        durable.write_file(self.path.parent, self.path.name, [body])
        self.saved = pos


class Barrier(Protocol):
    """What the mark waits for: the batching writer's count of events offered, and whether all
    of them up to a count are written (``collector.storage.writer.BatchWriter``)."""

    def ticket(self) -> int: ...

    def passed(self, ticket: int) -> bool: ...


class Progress(Protocol):
    """The source's side: where it has handed the log to ingest up to, how many events it handed
    over, and its mark."""

    handled: Position | None
    events: int
    mark: ResumeMark | None


async def keep_mark(source: Progress, barrier: Barrier, *, every: float = 0.2, first_within: float = 5.0) -> None:
    """Save the source's position each time the events read up to it are written (at once when
    none was read since the last save: the first start's position, ordinary kernel lines). At a
    stop (cancelled after the writer's last flush) the last position is saved if it is written.

    Until the source has a first position (at most ``first_within`` seconds) it is looked at
    every 20 ms, so the first start's position is saved as soon as the source has read once,
    whichever of the two tasks started first: a fault that comes next is read again after a kill."""
    mark = source.mark
    if mark is None:
        return
    saved_events = 0  # the source's event count at the last save
    pending: tuple[Position, int, int] | None = None
    first_by = time.monotonic() + first_within
    try:
        while True:
            if pending is None:
                pos, events = source.handled, source.events
                if pos is not None and pos != mark.saved:
                    # the position first: every event up to it was offered before the ticket
                    pending = (pos, events, barrier.ticket())
            if pending is not None:
                pos, events, ticket = pending
                if events == saved_events or barrier.passed(ticket):
                    if await asyncio.to_thread(_save, mark, pos):
                        saved_events = events
                    pending = None
                # else the database is down or behind: the mark waits, the log is read again after a kill
            first = mark.saved is None and source.handled is None and time.monotonic() < first_by
            await (asyncio.sleep(0.02) if first else sleep_to_tick(every))
    finally:
        pos = source.handled
        if pos is not None and pos != mark.saved and (source.events == saved_events or barrier.passed(barrier.ticket())):
            with contextlib.suppress(Exception):
                _save(mark, pos)


def _save(mark: ResumeMark, pos: Position) -> bool:
    try:
        mark.save(pos)
    except OSError as exc:
        if not mark.error:  # once per failing spell
            log.error("cannot save the kernel log's resume mark %s (%s): a restart reads the log again from the last one saved", mark.path, exc)
        mark.error = str(exc)
        return False
    if mark.error:
        log.warning("the kernel log's resume mark is saved again")
    mark.error = ""
    return True


def _opt_int(v: object) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"not an integer: {v!r}")
    return v


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)
