"""Following one container's output where the kubelet keeps it: a folder
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/`` of ``<restart count>.log`` files in the
runtime's CRI format (``collector.parsers.cri_log``).

- the newest ``N.log`` is followed; when the container restarts, ``N+1.log`` appears: the rest
  of the old file is read, then the new one from its start (a crash's last lines and the
  restart's first ones both arrive, in order);
- the kubelet's rotation (``0.log`` renamed to ``0.log.<timestamp>``, a new ``0.log`` opened by
  the runtime, older rotated files gzipped) is ``FileTail``'s rename rotation: the open handle
  is read to its end before the new file, whatever is later done to the old name;
- a folder that does not exist yet (the pod is starting) is waited for.

Blocking calls, meant to run in a worker thread, like ``FileTail``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from collector.parsers.cri_log import CriJoiner
from collector.sources.follow import DEFAULT_MAX_LINE_BYTES, FileTail

_LOG = re.compile(r"^(\d{1,9})\.log$")


def newest_log(folder: Path) -> tuple[int, Path] | None:
    """The ``N.log`` with the highest N in ``folder``, or None (no folder, no log yet)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    best: tuple[int, Path] | None = None
    for name in names:
        m = _LOG.match(name)
        if m is not None and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), folder / name)
    return best


class CriFolderTail:
    """``read_lines()`` gives the container's own lines (CRI envelope removed, partial records
    joined), across restarts and the kubelet's rotation; see the module docstring."""

    def __init__(self, folder: Path | str, *, from_start: bool = False, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.folder = Path(folder)
        self.from_start = from_start
        self.max_line_bytes = max_line_bytes
        self.joiner = CriJoiner(max_line_bytes)
        self.tail: FileTail | None = None
        self.current: int | None = None  # restart count of the file followed
        self.restarts_seen = 0
        self._first = True

    @property
    def rotations(self) -> int:
        return self.tail.rotations if self.tail is not None else 0

    def close(self) -> None:
        if self.tail is not None:
            self.tail.close()
            self.tail = None

    def read_lines(self) -> list[str]:
        newest = newest_log(self.folder)
        if self.tail is None:
            if newest is None:
                self._first = False  # a log that appears later is read from its start
                return []
            self._follow(newest, from_start=self.from_start or not self._first)
        assert self.tail is not None
        out = self._join(self.tail.read_lines())
        if newest is not None and self.current is not None and newest[0] > self.current:
            # the container restarted: the old file's last bytes and its unfinished last line
            # (a new container does not go on with it), then the new file from its start
            out += self._join(self.tail.read_lines() + self.tail.splitter.take_partial())
            out += self.joiner.take_partial()
            self.tail.close()
            self.restarts_seen += 1
            self._follow(newest, from_start=True)
            out += self._join(self.tail.read_lines())
        return out

    def _join(self, raw: list[str]) -> list[str]:
        out: list[str] = []
        for line in raw:
            out += self.joiner.feed(line)
        return out

    def _follow(self, newest: tuple[int, Path], *, from_start: bool) -> None:
        self.current, path = newest
        self.tail = FileTail(path, from_start=from_start, max_line_bytes=self.max_line_bytes)
        self._first = False

    @property
    def has_partial(self) -> bool:
        return self.joiner.has_partial or (self.tail is not None and self.tail.splitter.has_partial)

    def take_partial(self) -> list[str]:
        out: list[str] = []
        if self.tail is not None:
            for line in self.tail.splitter.take_partial():
                out += self.joiner.feed(line)
        return out + self.joiner.take_partial()
