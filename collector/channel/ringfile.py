"""A single-writer, many-reader ring of length-prefixed records in a memory-mapped file.

Layout (little endian)::

    header (64 bytes)
      0  magic      8s   b"FLRING01"
      8  version    u32  1
     12  hdr_size   u32  64
     16  capacity   u64  size of the data area in bytes
     24  head       u64  logical offset one past the last complete record (monotonic)
     32  tail       u64  logical offset of the oldest record still intact
     40  pid        u32  writer's pid
     44  reserved   u32
     48  created    f64  unix time the writer created the file
     56  reserved   8s
    data area (capacity bytes); logical offset L lives at 64 + L % capacity

    record = u32 length | u32 crc32(payload) | payload     (8-byte aligned)
    a length of 0xFFFFFFFF is padding: the rest of the area up to the wrap is unused

The writer publishes a record by writing it first and moving ``head`` after, so a reader never
sees a half-written record below ``head``. Before overwriting old bytes it moves ``tail`` past
the records it is about to destroy. A reader copies a record, then re-reads ``tail``: if the
writer lapped it meanwhile, the copy is discarded and counted as lost (a seqlock, in effect).
The CRC catches anything else (a torn copy, a file from a crashed writer).

The writer maps the file; the reader does not. A mapping of a file that someone truncates
raises SIGBUS at the next access to a page past the new end, and SIGBUS kills the process: in
the sidecar that would be every engine's recording lost to one ``truncate`` in the shared
folder. So the reader copies with ``os.pread``, whose short read of a shrunk file is an ordinary
``RingCorrupt``; it copies the whole stretch up to ``head`` (or the wrap) in one call, which
costs no more than slicing a mapping record by record (``bench/bench_ring_read.py``).

Both sides refuse what is not theirs (``collector.channel.secure``): the reader opens without
following a symlink or blocking on a FIFO and reads only a regular file of our user; the
writer creates its temporary file exclusively (a ``.tmp`` symlink planted by someone else is
removed, never followed) and makes the ring ``0600``.
"""

from __future__ import annotations

import errno
import functools
import mmap
import os
import struct
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from collector.channel.secure import FILE_MODE, open_private_file
from collector.errors import FlightrecError

__all__ = ["DEFAULT_CAPACITY", "HEADER_SIZE", "MAGIC", "VERSION", "RingCorrupt", "RingInfo", "RingReader", "RingRecords", "RingWriter"]

MAGIC = b"FLRING01"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQIId8s")
HEADER_SIZE = 64
REC = struct.Struct("<II")
PAD = 0xFFFFFFFF
ALIGN = 8
DEFAULT_CAPACITY = 16 * 1024 * 1024  # ~thousands of steps with per-request rows
_HEAD_AT = 24
_TAIL_AT = 32
_U64 = struct.Struct("<Q")
_U64_PACK = _U64.pack_into
_REC_PACK = REC.pack_into
_REC_SIZE = REC.size
_ALIGN_MASK = ALIGN - 1
_CHUNK = 1 << 20  # most bytes one pread copies; a longer stretch takes several
_SPAN = 1 << 20  # most bytes one re-read of records copies (RingRecords.payloads)
# The writer's pages are mapped when the ring is made (a few ms for 16 MiB), not at the first
# store into each: unpopulated, the ring's first lap took a page fault every 4 kB, 10-25 us more
# per 17 kB request record at 256 running, for the engine's first thousand steps.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class RingCorrupt(FlightrecError):
    """The file is not a ring file of a version we read."""


@functools.cache
def reader_crc32() -> Callable[[bytes | memoryview], int]:
    """The reader's CRC-32: ISA-L's (``isal``, a sidecar dependency), else zlib's. The same
    number (zlib's polynomial and conventions); ISA-L's uses the CPU's carry-less multiply: a
    16 kB ``R`` record in 2.0 us instead of 6.9 (``bench/bench_ring_read.py --crc``), and
    the sidecar checks 800 of them a second at 8 engines x 256 running x 100 steps/s. Looked
    up when the first reader opens, never at import: the writer, inside vLLM, keeps to the
    standard library (zlib)."""
    try:
        from isal import isal_zlib  # noqa: PLC0415 - the sidecar's readers only
    except ImportError:
        return zlib.crc32
    check = isal_zlib.crc32
    probe = bytes(range(256)) * 3
    if check(probe) != zlib.crc32(probe) or check(memoryview(probe)[5:]) != zlib.crc32(probe[5:]):
        return zlib.crc32  # (never seen: ISA-L's CRC-32 is zlib's; a build that differs is not used)
    return cast("Callable[[bytes | memoryview], int]", check)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _reserve(fd: int, size: int) -> None:
    """Allocate the file's blocks now. A sparse file on a full tmpfs (/dev/shm is 64 MiB in a
    default container) would fail later with SIGBUS on a store into the mapping, killing the
    engine; failing here raises OSError while the caller can still give up cleanly."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        return
    try:
        fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return  # file system without fallocate: nothing more we can check
        raise


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class RingWriter:
    """Appends records; never blocks, never raises on a full ring (old records are dropped).

    The constructor raises OSError when the file cannot be created or its space reserved.
    """

    def __init__(self, path: str | os.PathLike[str], *, capacity: int = DEFAULT_CAPACITY, mode: int = FILE_MODE) -> None:
        if capacity < 4096 or capacity % ALIGN:
            raise ValueError("capacity must be a multiple of 8 and at least 4096")
        self.path = Path(path)
        self.capacity = capacity
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        # A leftover (or planted) .tmp is removed, not opened: unlink removes a symlink itself,
        # and O_EXCL|O_NOFOLLOW then creates a new file or fails, never writing through a link.
        _unlink(tmp)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags, mode)
        try:
            os.ftruncate(fd, HEADER_SIZE + capacity)
            _reserve(fd, HEADER_SIZE + capacity)
            self._mm = mmap.mmap(fd, HEADER_SIZE + capacity, flags=_MAP_FLAGS)
        except OSError:
            os.close(fd)
            _unlink(tmp)
            raise
        os.close(fd)
        HEADER.pack_into(self._mm, 0, MAGIC, VERSION, HEADER_SIZE, capacity, 0, 0, os.getpid(), 0, time.time(), b"")
        os.replace(tmp, self.path)  # readers never see a file without its header
        self._head = 0
        self._tail = 0

    @property
    def head(self) -> int:
        """Logical offset one past the last published record; ``head // capacity`` counts wraps."""
        return self._head

    def append(self, payload: bytes, crc: int | None = None, tail: bytes = b"") -> int:
        """Publish one record, ``payload`` followed by ``tail`` (two parts copied into the ring
        as they are, no joined copy made first). ``crc``: ``zlib.crc32(payload + tail)`` when
        the caller has it already, else it is computed here.
        Returns the new ``head``."""
        first = len(payload)
        n = first + len(tail)
        if n == 0:
            raise ValueError("empty record")  # length 0 marks a corrupt header to readers
        size = (_REC_SIZE + n + _ALIGN_MASK) & ~_ALIGN_MASK
        cap = self.capacity
        if size > cap // 2:
            raise ValueError(f"record of {n} bytes is too large for a ring of {cap}")
        pos = self._head
        phys = pos % cap
        if phys + size > cap:
            # Not enough room before the wrap: pad to the end and start at 0.
            self._make_room(pos + (cap - phys) + size)
            if cap - phys >= _REC_SIZE:
                REC.pack_into(self._mm, HEADER_SIZE + phys, PAD, 0)
            pos += cap - phys
            phys = 0
        elif pos + size - cap > self._tail:  # (most appends overwrite nothing not yet dropped)
            self._make_room(pos + size)
        start = HEADER_SIZE + _REC_SIZE + phys
        mm = self._mm
        mm[start : start + first] = payload
        if tail:
            mm[start + first : start + n] = tail
        if crc is None:
            crc = zlib.crc32(tail, zlib.crc32(payload)) if tail else zlib.crc32(payload)
        _REC_PACK(mm, start - _REC_SIZE, n, crc)
        self._head = head = pos + size
        _U64_PACK(mm, _HEAD_AT, head)
        return head

    def _make_room(self, new_head: int) -> None:
        """Advance tail past every record that the bytes up to ``new_head`` will overwrite."""
        limit = new_head - self.capacity
        if self._tail >= limit:
            return
        cap = self.capacity
        tail = self._tail
        while tail < limit and tail < self._head:
            phys = tail % cap
            if cap - phys < REC.size:
                tail += cap - phys
                continue
            length, _ = REC.unpack_from(self._mm, HEADER_SIZE + phys)
            if length == PAD:
                tail += cap - phys
            else:
                tail += _aligned(REC.size + length)
        self._tail = max(tail, limit) if tail >= self._head else tail
        _U64.pack_into(self._mm, _TAIL_AT, self._tail)

    def close(self) -> None:
        try:
            self._mm.flush()
            self._mm.close()
        except (ValueError, OSError):
            pass


@dataclass(slots=True)
class RingInfo:
    capacity: int
    head: int
    tail: int
    pid: int
    created: float


class RingRecords:
    """A ring file's records read again where they lie: its reader's file, held open (a copy of
    the descriptor) while anything keeps a record's place in it, closed with the last holder.

    The sidecar keeps the large per-request records (``R``, 15 kB a step at 256 running) as
    their place in the ring rather than their bytes: the ring already holds them, several times
    longer than the sidecar's window of them (``collector.channel.blocks``). ``payload`` reads
    one again, checked as the reader checks it: the header at its place must say the same
    length, the CRC must match, and the writer must not have moved its tail past it while it
    was copied (else it is gone: None)."""

    __slots__ = ("__weakref__", "_closer", "_fd", "capacity", "path")

    def __init__(self, fd: int, path: Path, capacity: int) -> None:
        self._fd = os.dup(fd)
        self.path = path
        self.capacity = capacity
        self._closer = weakref.finalize(self, os.close, self._fd)

    def close(self) -> None:
        """Let the file go now (its records read as gone): a ring the sidecar deletes, or whose
        writer replaced it, must not keep its space in a small tmpfs for as long as a block of
        it is held."""
        self._closer()

    def payloads(self, wanted: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """``payload`` of each (place, length), in one ``pread`` per stretch of the file they
        lie in (a capture copies a window's hundreds of blocks: one read each was ~10 us), the
        tail read once after."""
        out: list[bytes | None] = [None] * len(wanted)
        order = sorted(range(len(wanted)), key=lambda i: wanted[i][0])
        cap = self.capacity
        i = 0
        while i < len(order):
            # a stretch: places in order whose records lie one after another in the file
            first = wanted[order[i]][0]
            lo = first % cap
            j, hi = i, lo
            while j < len(order):
                pos, length = wanted[order[j]]
                phys = pos % cap
                if length <= 0 or phys < hi or phys + REC.size + length > cap or pos - first != phys - lo or phys + REC.size + length - lo > _SPAN:
                    break
                hi = phys + REC.size + length
                j += 1
            if j == i:  # not one that fits a stretch: alone
                pos, length = wanted[order[i]]
                out[order[i]] = self.payload(pos, length)
                i += 1
                continue
            try:
                buf = os.pread(self._fd, hi - lo, HEADER_SIZE + lo)
                tail = _U64.unpack(os.pread(self._fd, 8, _TAIL_AT))[0]
            except (OSError, ValueError, struct.error):
                i = j
                continue
            view = memoryview(buf)
            for k in order[i:j]:
                pos, length = wanted[k]
                at = pos % cap - lo
                if tail > pos or at + REC.size + length > len(buf):
                    continue
                size, crc = REC.unpack_from(buf, at)
                payload = view[at + REC.size : at + REC.size + length]
                if size == length and reader_crc32()(payload) == crc:
                    out[k] = bytes(payload)
            i = j
        return out

    def payload(self, pos: int, length: int) -> bytes | None:
        """The record whose header is at logical offset ``pos``, if it is still there whole."""
        phys = pos % self.capacity
        if length <= 0 or phys + REC.size + length > self.capacity:
            return None
        try:
            raw = os.pread(self._fd, REC.size + length, HEADER_SIZE + phys)
            tail = _U64.unpack(os.pread(self._fd, 8, _TAIL_AT))[0]
        except (OSError, ValueError, struct.error):  # closed, or the file cut short
            return None
        if len(raw) != REC.size + length or tail > pos:
            return None
        size, crc = REC.unpack_from(raw)
        payload = raw[REC.size :]
        if size != length or reader_crc32()(payload) != crc:
            return None
        return payload


class RingReader:
    """Reads the records a writer published since the last call. Starts at the ring's tail.

    Raises RingCorrupt when the file is not a ring, not a regular file of ours, a symlink, or
    shorter than its header says (truncated, also later, while being read).
    """

    def __init__(self, path: str | os.PathLike[str], *, owner: int | None = None) -> None:
        self.path = Path(path)
        try:
            self._fd = open_private_file(self.path, owner=owner)
        except OSError as exc:
            raise RingCorrupt(f"{self.path}: cannot open: {exc}") from exc
        try:
            info = self.info()
            st = os.fstat(self._fd)
        except (OSError, RingCorrupt):
            os.close(self._fd)
            raise
        if st.st_size != HEADER_SIZE + info.capacity:
            os.close(self._fd)
            raise RingCorrupt(f"{self.path}: size does not match its header")
        # the file this reader holds open, and who wrote it: a writer started again under the
        # same name replaces the file (``os.replace``: a new inode) while this one still reads
        # the old (``replaced``)
        self.file_id = (st.st_dev, st.st_ino)
        self.created = info.created
        self.writer_pid = info.pid
        self.capacity = info.capacity
        self.pos = info.tail
        self._records: RingRecords | None = None
        self.lost_bytes = 0
        self.corrupt_records = 0

    def _pread(self, length: int, offset: int) -> bytes:
        try:
            data = os.pread(self._fd, length, offset)
        except OSError as exc:
            raise RingCorrupt(f"{self.path}: cannot read: {exc}") from exc
        if len(data) != length:
            raise RingCorrupt(f"{self.path}: truncated (short read at {offset})")
        return data

    def info(self) -> RingInfo:
        magic, version, hdr, cap, head, tail, pid, _, created, _ = HEADER.unpack(self._pread(HEADER_SIZE, 0))
        if magic != MAGIC or version != VERSION or hdr != HEADER_SIZE or cap <= 0:
            raise RingCorrupt(f"{self.path}: not a flight-recorder ring (magic {magic!r})")
        return RingInfo(cap, head, tail, pid, created)

    def replaced(self) -> bool:
        """Whether the path now names another ring than the one this reader holds: another file
        (a new inode), or this file rewritten in place (another creation time or writer pid in
        its header). A path gone is not a replacement (the folder's listing says it is gone)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != self.file_id:
            return True
        try:
            info = self.info()
        except RingCorrupt:
            return False
        return info.created != self.created or info.pid != self.writer_pid

    def _tail_now(self) -> int:
        return int(_U64.unpack(self._pread(8, _TAIL_AT))[0])

    def read(self, max_records: int = 100_000) -> list[bytes]:
        """The records published since the last call, each its own bytes."""
        return cast("list[bytes]", self._read(max_records, views=False))

    def read_views(self, max_records: int = 100_000, *, places: list[int] | None = None) -> list[memoryview]:
        """The records published since the last call, as views of this read's copies of the
        file: no record is copied again here (an ``R`` record at 256 running requests is 14.6
        kB; it was sliced out of its copy and sliced again into its parts). A view holds its
        whole copy (up to 1 MiB) alive: take what is kept out of it, then drop the views.
        ``places``: each record's logical offset is appended to it (``records`` reads one again)."""
        return cast("list[memoryview]", self._read(max_records, views=True, places=places))

    def records(self) -> RingRecords:
        """This ring's records, to read again by their place (``RingRecords``). OSError when
        the descriptor cannot be copied (or this reader is closed)."""
        if self._records is None:
            if self._fd < 0:
                raise OSError(f"{self.path}: the reader is closed")
            self._records = RingRecords(self._fd, self.path, self.capacity)
        return self._records

    def _read(self, max_records: int, *, views: bool, places: list[int] | None = None) -> list[bytes | memoryview]:
        info = self.info()
        cap = info.capacity
        out: list[bytes | memoryview] = []
        if self.pos < info.tail:
            self.lost_bytes += info.tail - self.pos
            self.pos = info.tail
        head = info.head
        while self.pos < head and len(out) < max_records:
            phys = self.pos % cap
            if cap - phys < REC.size:
                self.pos += cap - phys
                continue
            # Copy the stretch up to head or the wrap, then check the tail once: every record
            # that starts at or past the tail read after the copy was intact while copied,
            # since the writer moves the tail before it overwrites.
            span = min(head - self.pos, cap - phys, _CHUNK)
            buf = self._pread(span, HEADER_SIZE + phys)
            tail_now = self._tail_now()
            if tail_now > self.pos:
                # Overwritten (some of it) while we copied: drop it and resync at the new tail.
                self.lost_bytes += tail_now - self.pos
                self.pos = tail_now
                continue
            self._parse(memoryview(buf) if views else buf, phys, cap, head, out, max_records, places)
        return out

    def _parse(
        self, buf: bytes | memoryview, phys: int, cap: int, head: int, out: list[bytes | memoryview], max_records: int, places: list[int] | None
    ) -> None:
        """Take the whole records of ``buf`` (the bytes at ``phys``), moving ``self.pos``: each
        a slice of ``buf`` (its own bytes, or a view of them). The loop runs once per record
        (four a step at 256 running): its names are locals, ``self.pos`` is written back once."""
        off = 0
        pos = self.pos
        n = len(buf)
        room = max_records - len(out)
        unpack, crc32, append, rec_size = REC.unpack_from, reader_crc32(), out.append, _REC_SIZE
        placed = places.append if places is not None else None
        bad = 0
        try:
            while off + rec_size <= n and room > 0:
                at = phys + off
                length, crc = unpack(buf, off)
                if length == PAD:
                    pos += cap - at
                    return
                end = off + rec_size + length
                if length == 0 or length > cap - at - rec_size:
                    # Impossible for a sound record: the bytes are bad. Record boundaries cannot
                    # be found by scanning (payload bytes may look like a header), so resync at
                    # the tail if it moved, else give up on this stretch.
                    bad += 1
                    tail_now = self._tail_now()
                    pos = tail_now if tail_now > pos else head
                    return
                if end > n:
                    if off == 0 and rec_size + length > n:
                        # Longer than one copy, or the stretch ends inside it: past head means
                        # the header is bad; else copy this one record alone.
                        if pos + rec_size + length > head:
                            bad += 1
                            pos = head
                            return
                        self.pos = pos
                        self._parse_one(phys, length, crc, out, views=isinstance(buf, memoryview), places=places)
                        pos += (rec_size + length + _ALIGN_MASK) & ~_ALIGN_MASK
                    return
                payload = buf[off + rec_size : end]
                if crc32(payload) != crc:
                    bad += 1
                else:
                    append(payload)
                    room -= 1
                    if placed is not None:
                        placed(pos)
                size = (rec_size + length + _ALIGN_MASK) & ~_ALIGN_MASK
                pos += size
                off += size
            if off < n and pos % cap + rec_size > cap:
                pos += cap - pos % cap
        finally:
            self.pos = pos
            self.corrupt_records += bad

    def _parse_one(self, phys: int, length: int, crc: int, out: list[bytes | memoryview], *, views: bool, places: list[int] | None) -> None:
        payload = self._pread(length, HEADER_SIZE + phys + REC.size)
        if self._tail_now() > self.pos:
            self.lost_bytes += REC.size + length
        elif reader_crc32()(payload) != crc:
            self.corrupt_records += 1
        else:
            out.append(memoryview(payload) if views else payload)
            if places is not None:
                places.append(self.pos)

    def release(self) -> RingRecords | None:
        """Close this reader's file and hand over its ``records`` (None where none were made),
        which stay readable until closed or let go."""
        self.close()
        records, self._records = self._records, None
        return records

    def close(self) -> None:
        """Close this reader's file (its ``records``, where made, stay readable until let go)."""
        if self._fd < 0:
            return
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = -1
