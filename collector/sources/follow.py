"""Following a file like ``tail -F``: whole lines appended to it, across truncation and
rotation. Shared by the engine-log source and the kernel-log source when it follows a file.

Blocking calls (reads of a regular file), meant to run in a worker thread or between polls.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from collector.sources.base import SourceError

DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024  # a vLLM crash dump of a few thousand requests fits
_CHUNK = 256 * 1024
_MAX_CHUNKS_PER_POLL = 64  # a large backlog is read over several polls, never all at once
_HEAD = 256  # the file's first bytes, kept to tell a file truncated and written past our place again


def open_followed(path: Path) -> IO[bytes] | None:
    """The followed file opened for reading, None while it does not exist; any other failure
    (permission, a directory...) is the operator's to fix: ``SourceError``."""
    try:
        return open(path, "rb")  # noqa: SIM115 - held open across polls
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"cannot open {path}: {exc}") from exc


class LineSplitter:
    """Bytes in, whole decoded lines out; a line longer than ``max_bytes`` is cut."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._partial = b""
        self.last_data = 0.0  # clock of the last bytes added to the partial line

    def feed(self, data: bytes) -> list[str]:
        buf = self._partial + data
        *whole, self._partial = buf.split(b"\n")
        out = [w.decode("utf-8", "replace") for w in whole]
        while len(self._partial) > self.max_bytes:
            out.append(self._partial[: self.max_bytes].decode("utf-8", "replace"))
            self._partial = self._partial[self.max_bytes :]
        return out

    def take_partial(self) -> list[str]:
        rest, self._partial = self._partial, b""
        return [rest.decode("utf-8", "replace")] if rest else []

    @property
    def has_partial(self) -> bool:
        return bool(self._partial)


class FileTail:
    """``tail -F`` over one path: blocking calls, meant to run in a worker thread."""

    def __init__(self, path: Path | str, *, from_start: bool = False, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.path = Path(path)
        self._fh: IO[bytes] | None = None
        self._ino: tuple[int, int] | None = None
        self._pos = 0
        self._first_open = True
        self._from_start = from_start
        self.splitter = LineSplitter(max_line_bytes)
        self.rotations = 0
        self.truncations = 0
        # The first bytes read from the file (up to _HEAD): a process started again on the same
        # log (``open(path, "w")``: same inode) can write past our place before we look (a
        # slow poll, a busy machine), which the size alone does not show; its first line (time,
        # pid) does. One pread of these bytes a poll while they are fewer than our place.
        self._head = b""

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self) -> bool:
        fh = open_followed(self.path)
        if fh is None:
            self._first_open = False  # a file that appears later is read from its start
            return False
        st = os.fstat(fh.fileno())
        self._fh, self._ino, self._pos = fh, (st.st_dev, st.st_ino), 0
        self._head = b""
        if self._first_open and not self._from_start:
            self._pos = fh.seek(0, os.SEEK_END)
            self._head = os.pread(fh.fileno(), min(_HEAD, self._pos), 0)
        self._first_open = False
        return True

    def _rewritten(self, size: int) -> bool:
        """The file now starts with other bytes than those we read from it: truncated and
        written again (past our place, or the size would have said so)."""
        if not self._head or self._fh is None or size < len(self._head):
            return False
        try:
            return os.pread(self._fh.fileno(), len(self._head), 0) != self._head
        except OSError:
            return False

    def read_lines(self) -> list[str]:
        if self._fh is None and not self._open():
            return []
        lines: list[str] = []
        try:
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None  # moved away, no new file yet: keep reading the old handle
        if st is not None and (st.st_dev, st.st_ino) == self._ino and (st.st_size < self._pos or self._rewritten(st.st_size)):
            # Truncated (copytruncate), or written again from its start: read it from there.
            lines += self.splitter.take_partial()
            self._pos, self._head = 0, b""
            self.truncations += 1
        lines += self._read_available()
        if st is not None and (st.st_dev, st.st_ino) != self._ino:
            # Rotated by rename: finish the old file (the writer may have added a last
            # line before reopening), then read the new one from its start.
            lines += self._read_available()
            lines += self.splitter.take_partial()
            self.close()
            self.rotations += 1
            if self._open():
                lines += self._read_available()
        return lines

    def _read_available(self) -> list[str]:
        fh = self._fh
        assert fh is not None
        fh.seek(self._pos)
        lines: list[str] = []
        for _ in range(_MAX_CHUNKS_PER_POLL):
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            self._pos += len(chunk)
            lines += self.splitter.feed(chunk)
        if len(self._head) < _HEAD and self._pos > len(self._head):
            self._head = os.pread(fh.fileno(), min(_HEAD, self._pos), 0)
        return lines
