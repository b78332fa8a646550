"""A kernel log written to a plain file (``kmsg: /var/log/kern.log``), followed like ``tail -F``,
each line with its place in the file: the device and inode of the file that holds it and its
byte offsets. The place is what the kernel-log source's resume mark keeps for a file
(``collector.sources.kmsg_mark``), and what makes a line read twice (after a restart) the same
record.

Blocking reads of a regular file, between polls. The file may not exist yet (it is then read
from its start when it appears), and it survives truncation (read again from its start) and
rotation by rename (the old file is finished, the new one read from its start).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from collector.sources.follow import _CHUNK, _MAX_CHUNKS_PER_POLL, open_followed

MAX_LINE_BYTES = 64 * 1024  # a kernel record is at most about 1 KiB

FileId = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True, slots=True)
class FileLine:
    file: FileId
    start: int  # byte offset of the line's first byte
    end: int  # byte offset just past it (and its newline)
    text: str


class KernelLogFile:
    """``start``: where an earlier run stopped, (device, inode, offset); read from there when it
    is the same file, from its start when the file was replaced meanwhile. Without it the file is
    read from its end (or its start with ``from_start``)."""

    def __init__(self, path: str | Path, *, start: tuple[int, int, int] | None = None, from_start: bool = False) -> None:
        self.path = Path(path)
        self._start = start
        self._from_start = from_start
        self._fh: IO[bytes] | None = None
        self._id: FileId | None = None
        self._pos = 0  # next byte to read
        self._partial = b""  # bytes read after the last newline
        self._first_open = True
        self.first_file: FileId | None = None
        self.backlog_end = 0  # in the first file: lines starting before this were there at the open
        self.resumed = False  # the first open continued where ``start`` said
        self.replaced = False  # ``start`` named another file (rotated or replaced while stopped)
        self.rotations = 0
        self.truncations = 0

    def place(self) -> tuple[int, int, int] | None:
        """(device, inode, offset of the first byte of a line not returned yet), or None."""
        if self._id is None:
            return None
        return (self._id[0], self._id[1], self._pos - len(self._partial))

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
        ident = (st.st_dev, st.st_ino)
        pos = 0
        if self._first_open:
            self.first_file, self.backlog_end = ident, st.st_size
            start = self._start
            if start is not None and (start[0], start[1]) == ident and start[2] <= st.st_size:
                pos, self.resumed = start[2], True
            elif start is not None:
                self.replaced = True  # another file, or this one truncated: all of it is new
            elif not self._from_start:
                pos = st.st_size
        self._first_open = False
        self._fh, self._id, self._pos, self._partial = fh, ident, pos, b""
        return True

    def read(self) -> list[FileLine]:
        if self._fh is None and not self._open():
            return []
        lines = self._read_available()
        try:
            st = os.stat(self.path)
        except OSError:
            return lines  # moved away, no new file yet: keep reading the old handle
        if (st.st_dev, st.st_ino) != self._id:
            # Rotated by rename: finish the old file (the writer may have added a last line
            # before reopening), then read the new one from its start.
            lines += self._read_available()
            lines += self._take_partial()
            self.close()
            self.rotations += 1
            if self._open():
                lines += self._read_available()
        elif st.st_size < self._pos:
            lines += self._take_partial()
            self._pos = 0
            self.truncations += 1
            lines += self._read_available()
        return lines

    def _read_available(self) -> list[FileLine]:
        fh, ident = self._fh, self._id
        assert fh is not None and ident is not None
        fh.seek(self._pos)
        out: list[FileLine] = []
        for _ in range(_MAX_CHUNKS_PER_POLL):
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            base = self._pos - len(self._partial)
            self._pos += len(chunk)
            *whole, self._partial = (self._partial + chunk).split(b"\n")
            for raw in whole:
                out.append(FileLine(ident, base, base + len(raw) + 1, raw.decode("utf-8", "replace")))
                base += len(raw) + 1
            while len(self._partial) > MAX_LINE_BYTES:  # not a kernel record: cut, never held whole
                piece, self._partial = self._partial[:MAX_LINE_BYTES], self._partial[MAX_LINE_BYTES:]
                out.append(FileLine(ident, base, base + len(piece), piece.decode("utf-8", "replace")))
                base += len(piece)
        return out

    def _take_partial(self) -> list[FileLine]:
        if not self._partial or self._id is None:
            return []
        rest, self._partial = self._partial, b""
        return [FileLine(self._id, self._pos - len(rest), self._pos, rest.decode("utf-8", "replace"))]
