"""The container runtime's log format (CRI), as the kubelet keeps a container's output under
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log``::

    2026-12-03T10:00:00.123456789Z stdout F INFO 12-03 10:00:00 [api_server.py:1] started
    2026-12-03T10:00:00.223456789Z stderr P the first 16 KiB of a long line
    2026-12-03T10:00:00.223456789Z stderr F ... and its end

Each record is ``<RFC 3339 time> <stream> <tag> <message>``; the tag is ``F`` (full: the
message ends the line) or ``P`` (partial: the runtime cut a long line, containerd at 16 KiB,
and the rest follows in the next records of the same stream). Newer runtimes may add
further tags after a colon (``F:x``); the first one is what matters.

``parse_cri_line`` reads one record; ``CriJoiner`` puts partial records back together per
stream, so what comes out is the container's lines as the process wrote them. Pure: no I/O.
A line that is not a CRI record is passed through as it is (a plain log, or a runtime that
writes another format), never dropped.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import NamedTuple

_RECORD = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})) "
    r"(?P<stream>stdout|stderr) "
    r"(?P<tag>[A-Z](?::[^ ]*)?)"
    r"(?: (?P<msg>.*)|$)",
    re.DOTALL,
)
_FRACTION = re.compile(r"\.(\d{1,9})")


class CriRecord(NamedTuple):
    ts: float | None  # unix seconds; None when the time does not parse
    stream: str  # "stdout" or "stderr"
    partial: bool  # tag P: the line goes on in the next record of this stream
    message: str


def parse_time(text: str) -> float | None:
    """RFC 3339 with up to nanoseconds (``datetime`` takes microseconds: the rest is cut)."""
    m = _FRACTION.search(text)
    if m is not None:
        text = text[: m.start()] + "." + m.group(1)[:6].ljust(6, "0") + text[m.end() :]
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_cri_line(line: str) -> CriRecord | None:
    """One CRI record, or None when ``line`` is not one."""
    m = _RECORD.match(line)
    if m is None:
        return None
    return CriRecord(parse_time(m.group("ts")), m.group("stream"), m.group("tag")[0] == "P", m.group("msg") or "")


class CriJoiner:
    """CRI records in, the container's own lines out (partials joined per stream).

    ``max_bytes`` bounds a line being joined: past it, what is held is given out as one line
    (as ``LineSplitter`` cuts an over-long plain line), so a stream of partials without an end
    cannot grow without bound.
    """

    def __init__(self, max_bytes: int = 4 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._held: dict[str, list[str]] = {}
        self._held_len: dict[str, int] = {}
        self.records = 0
        self.foreign = 0  # lines that were not CRI records (passed through)

    def feed(self, line: str) -> list[str]:
        rec = parse_cri_line(line)
        if rec is None:
            self.foreign += 1
            return [line]
        self.records += 1
        held = self._held.setdefault(rec.stream, [])
        held.append(rec.message)
        size = self._held_len.get(rec.stream, 0) + len(rec.message)
        if rec.partial and size < self.max_bytes:
            self._held_len[rec.stream] = size
            return []
        self._held[rec.stream] = []
        self._held_len[rec.stream] = 0
        return ["".join(held)]

    def take_partial(self) -> list[str]:
        """What is held of unfinished lines (the container died mid-line), one line per stream."""
        out = ["".join(parts) for parts in self._held.values() if parts]
        self._held.clear()
        self._held_len.clear()
        return out

    @property
    def has_partial(self) -> bool:
        return any(self._held.values())
