"""Internal: Per-request rows as the recorder wrote them: one ``RequestBlock`` per step, never one Python
object per row.

At one 8-GPU node's load (8 engines x 100 steps/s x 256 running requests) decoding every ``R``
record into row objects was 8.4 M objects a minute and 70% of the sidecar's CPU. A block keeps
the record's bytes (columns, then the NUL-joined ids) and the few per-step aggregates the live
series and the detectors need, all computed by C loops (``bytes.count``, ``sum`` over an
``array``). Rows are decoded only when someone reads a snapshot (``decode_columns``), and the
ids part is shared with the previous step's block when it did not change (it rarely does: the
running set is stable for many steps), which halves what a ring of blocks holds.
"""

from __future__ import annotations

import logging
import struct
import zlib
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from collector.channel.codec import (
    FLAG_HOST_BLOCKS,
    FLAG_KEPT,
    FLAG_MIRROR,
    REQS_HEAD,
    STATUS_CODE,
    STATUSES,
    TAG_REQS,
    CodecError,
)
from collector.channel.ringfile import RingRecords
from collector.model import StepRequests

log = logging.getLogger(__name__)

RUNNING = STATUS_CODE["running"]
# the export's request columns, in order (``collector.snapshot.document.REQUEST_COLUMNS``)
COLUMNS = ("step", "request_id", "prompt_len", "computed_tokens", "output_tokens", "preemptions", "status", "mirror_rows", "host_blocks")
_HEAD = 1 + REQS_HEAD.size
_REC_HEADER = 8  # a ring record's length and CRC before its payload (collector.channel.ringfile)
_TAG = TAG_REQS[0]
_LAST_STATUS = len(STATUSES) - 1
_I32 = np.dtype("<i4")
_STATUS_OF_BYTE = [STATUSES[min(c, _LAST_STATUS)] for c in range(256)]  # any wire byte -> a name


def _known_sum(col: bytes | memoryview) -> int | None:
    """Sum of an i32 column whose -1 means unknown; None when every value is unknown. (numpy's
    sum, 3 us at 256 rows: ``sum`` over an ``array`` boxes each value, and ``array.count``
    compares boxed values too, 9 us together; twice a step with HiSparse.)"""
    a = np.frombuffer(col, dtype=_I32)
    total = int(a.sum(dtype=np.int64))
    if a.min() >= 0:
        return total
    unknown = int(np.count_nonzero(a == -1))
    return None if unknown == len(a) else total + unknown


class RunningSet:
    """The running set's columns of a full ``R`` record (prompt lengths, preemptions, statuses,
    ids), which the records after it that keep them (``FLAG_KEPT``) share. The small columns are
    copied once per set; the ids (most of a record's bytes) stay in the full record, read from
    its ring the first time a row is read (a capture, the API), then held."""

    __slots__ = ("_full", "_ids", "n", "nbytes", "preempt", "prompt", "running", "status")

    def __init__(self, full: RequestBlock, cols: bytes | memoryview, ids: bytes | memoryview) -> None:
        n = self.n = full.n
        self.prompt = bytes(cols[: 4 * n])
        self.preempt = bytes(cols[12 * n : 16 * n])
        self.status = bytes(cols[16 * n : 17 * n])
        self.running = self.status.count(RUNNING)
        self.nbytes = 9 * n + len(ids)  # what a full record holds that a kept one does not
        held = full.held
        self._full: RequestBlock | None = None if held else full
        self._ids: bytes | None = bytes(ids) if held else None

    @property
    def ids(self) -> bytes | None:
        """The ids, NUL-joined; None once the ring overwrote the full record before they were read."""
        if self._ids is None and self._full is not None:
            parts = self._full.parts()
            self._full = None
            if parts is not None:
                self._ids = bytes(parts[1])
        return self._ids


class RequestBlock:
    """One step's running requests: the ``R`` record's bytes plus its aggregates (the
    ``collector.model.StepRequests`` every stage reads).

    A block read from a ring (``in_ring``) keeps the record's place there, not its bytes: the
    ring holds each record several times longer than the sidecar's window of them, and reading
    again the few a snapshot or a reader wants is cheaper than holding them all (the window's
    32 MiB of copies were the sidecar's largest memory). ``parts`` reads them (None once the
    writer overwrote the record); ``resident`` is a copy that holds its bytes (a snapshot's
    capture takes one, so what it froze no longer depends on the ring)."""

    __slots__ = ("_cols", "_ids", "_len", "_place", "_ring", "_set", "flags", "host_blocks", "mirror_rows", "n", "nbytes", "running", "step", "ts")

    def __init__(self, step: int, ts: float, n: int, flags: int, cols: bytes, ids: bytes) -> None:
        self.step = step
        self.ts = ts
        self.n = n
        self.flags = flags
        self._cols: bytes | None = cols  # the u32/u8/i32 columns, in wire order
        self._ids: bytes | None = ids  # the ids, UTF-8, NUL-joined (their count is checked when decoded)
        self._ring: RingRecords | None = None
        self._set: RunningSet | None = None  # a record that kept its running set's columns: that set
        self._place = 0
        self._len = 0
        self._aggregates(cols)
        # what holding it costs, for the rings' byte bound (read three times a step there); the
        # same when ingest points the ids at an equal earlier copy, or it is held in its ring
        self.nbytes = len(cols) + len(ids) + 96

    def _aggregates(self, cols: bytes | memoryview, kept: RunningSet | None = None) -> None:
        """``cols``: a full record's columns, or (``kept``) a kept record's own ones."""
        n = self.n
        if kept is None:
            self.running = bytes(cols[16 * n : 17 * n]).count(RUNNING)
            pos = 17 * n
        else:
            self.running = kept.running
            pos = 8 * n
        self.mirror_rows: int | None = None
        self.host_blocks: int | None = None
        if self.flags & FLAG_MIRROR:
            self.mirror_rows = _known_sum(cols[pos : pos + 4 * n]) if n else None
            pos += 4 * n
        if self.flags & FLAG_HOST_BLOCKS:
            self.host_blocks = _known_sum(cols[pos : pos + 4 * n]) if n else None

    @classmethod
    def from_payload(cls, payload: bytes | memoryview, prev: StepRequests | None = None, kept: RunningSet | None = None) -> RequestBlock:
        """From an ``R`` payload (tag included), its parts copied once out of it (a view of a
        ring read's copy is not kept). ``prev``: the same engine's previous block, whose ids
        bytes are reused when equal (one copy held for a stable running set).

        The ids are not counted here: that scan of ~10 kB cost more than the record's CRC, at
        every step, for rows decoded only when a snapshot is read. ``decode_columns`` checks
        them, and a block whose ids do not match its rows gets unknown ids there.

        A record that kept its running set's columns (``FLAG_KEPT``) needs that set (``kept``:
        the full record's before it, ``RequestRecords``); without it, or with another row count,
        it is a ``CodecError``."""
        step, ts, n, flags, end = _head(payload)
        if flags & FLAG_KEPT:
            own = _kept_set(kept, n)
            ids = own.ids
            if ids is None:
                raise CodecError("request record keeps the running set of a record its ring no longer holds")
            return cls(step, ts, n, flags & ~FLAG_KEPT, _full_cols(own, payload[_HEAD:end], n), ids)
        ids = bytes(payload[end:])
        if prev is not None and prev.ids == ids:
            ids = prev.ids
        return cls(step, ts, n, flags, bytes(payload[_HEAD:end]), ids)

    @classmethod
    def in_ring(cls, payload: bytes | memoryview, ring: RingRecords, place: int, kept: RunningSet | None = None) -> RequestBlock:
        """From an ``R`` payload read at logical offset ``place`` of ``ring``: its aggregates
        computed now, its bytes left where they lie (``parts`` reads them again). A record that
        kept its running set's columns holds that set (``kept``, as ``from_payload``)."""
        step, ts, n, flags, end = _head(payload)
        block = cls.__new__(cls)
        block.step, block.ts, block.n, block.flags = step, ts, n, flags & ~FLAG_KEPT
        block._cols = block._ids = None
        block._ring, block._place, block._len = ring, place, len(payload)
        if flags & FLAG_KEPT:
            block._set = own = _kept_set(kept, n)
            block._aggregates(payload[_HEAD:end], own)
            # counted as the full record it stands for: the rings' byte bound holds as many steps
            block.nbytes = len(payload) - _HEAD + own.nbytes + 96
        else:
            block._set = None
            block._aggregates(payload[_HEAD:end])
            block.nbytes = len(payload) - _HEAD + 96
        return block

    def parts(self) -> tuple[bytes, bytes] | None:
        """The columns and the ids, read from the ring where the block was left there; None
        when they are gone (the ring no longer holds them, or a capture found it so)."""
        if self._cols is not None and self._ids is not None:
            return self._cols, self._ids
        if self._ring is None:
            return None
        return self._split(self._ring.payload(self._place, self._len))

    def _split(self, payload: bytes | None) -> tuple[bytes, bytes] | None:
        """This block's columns and ids from its record read again; None when the record there
        is no longer this one."""
        own = self._set
        flags = self.flags if own is None else self.flags | FLAG_KEPT
        if payload is None or payload[:1] != TAG_REQS or REQS_HEAD.unpack_from(payload, 1) != (self.step, self.ts, self.n, flags):
            return None
        if own is not None:
            ids = own.ids
            return None if ids is None else (_full_cols(own, payload[_HEAD:], self.n), ids)
        end = _HEAD + _width(flags) * self.n
        return payload[_HEAD:end], payload[end:]

    def resident(self) -> RequestBlock:
        """This block, not depending on a ring: itself where it does not; else a copy holding
        its bytes, or (the ring no longer holds them) a ``gone`` one keeping the aggregates."""
        if self._ring is None:
            return self
        return self._copy(self._ring.payload(self._place, self._len))

    @staticmethod
    def resident_many(blocks: Sequence[RequestBlock]) -> list[RequestBlock]:
        """``resident`` of each, the blocks left in one ring read back in one ``pread`` per
        stretch of it (``RingRecords.payloads``)."""
        out = list(blocks)
        by_ring: dict[int, list[int]] = {}
        for i, b in enumerate(out):
            if b._ring is not None:
                by_ring.setdefault(id(b._ring), []).append(i)
        for idx in by_ring.values():
            ring = out[idx[0]]._ring
            assert ring is not None
            got = ring.payloads([(out[i]._place, out[i]._len) for i in idx])
            for i, payload in zip(idx, got, strict=True):
                out[i] = out[i]._copy(payload)
        return out

    def _copy(self, payload: bytes | None) -> RequestBlock:
        """This block held: its bytes from ``payload`` (its record read again), or gone."""
        parts = self._split(payload)
        block = RequestBlock.__new__(RequestBlock)
        block.step, block.ts, block.n, block.flags = self.step, self.ts, self.n, self.flags
        block.running, block.mirror_rows, block.host_blocks, block.nbytes = self.running, self.mirror_rows, self.host_blocks, self.nbytes
        block._cols, block._ids = parts if parts is not None else (None, None)
        block._ring, block._place, block._len, block._set = None, 0, 0, None
        return block

    @property
    def held(self) -> bool:
        """Whether the block depends on no ring (its bytes in memory, or gone)."""
        return self._ring is None

    @property
    def gone(self) -> bool:
        """Whether its bytes are lost (its ring overwrote them before a capture copied them):
        the aggregates stand, the rows do not."""
        return self._ring is None and self._cols is None

    @property
    def cols(self) -> bytes:
        """The columns (b"" when they are gone)."""
        parts = self.parts()
        return b"" if parts is None else parts[0]

    @property
    def ids(self) -> bytes:
        """The NUL-joined ids (b"" when they are gone)."""
        parts = self.parts()
        return b"" if parts is None else parts[1]

    @ids.setter
    def ids(self, value: bytes) -> None:
        """Point a held block's ids at an equal copy (ingest: one copy for a stable set)."""
        if self._cols is not None:
            self._ids = value

    def payload(self) -> bytes:
        parts = self.parts()
        if parts is None:
            raise CodecError(f"request block of step {self.step}: its bytes are gone from its ring")
        return b"".join((TAG_REQS, REQS_HEAD.pack(self.step, self.ts, self.n, self.flags), *parts))

    def column(self, name: str) -> list[Any]:
        """One column of this block, decoded."""
        return decode_columns([self])[name]


def _width(flags: int) -> int:
    """Bytes a row of a record with these flags takes before the ids (none follow a kept one)."""
    return (8 if flags & FLAG_KEPT else 17) + (4 if flags & FLAG_MIRROR else 0) + (4 if flags & FLAG_HOST_BLOCKS else 0)


def _kept_set(kept: RunningSet | None, n: int) -> RunningSet:
    if kept is None:
        raise CodecError("request record keeps the running set of an earlier record, which this reader has not read")
    if kept.n != n:
        raise CodecError(f"request record of {n} rows keeps the running set of a record of {kept.n}")
    return kept


def _full_cols(kept: RunningSet, own: bytes | memoryview, n: int) -> bytes:
    """A full record's columns from a kept record's own (computed, output, the optional ones)
    and the set it kept."""
    return b"".join((kept.prompt, own[: 8 * n], kept.preempt, kept.status, own[8 * n :]))


def _head(payload: bytes | memoryview) -> tuple[int, float, int, int, int]:
    """An ``R`` payload's step, time, rows, flags and where its ids start; a ``CodecError``
    for one that does not add up."""
    if len(payload) < _HEAD or payload[0] != _TAG:
        raise CodecError("short or untagged request record")
    step, ts, n, flags = REQS_HEAD.unpack_from(payload, 1)
    end = _HEAD + _width(flags) * n
    size = len(payload)
    if size < end:
        raise CodecError(f"request record of {n} rows is truncated")
    if (not n or flags & FLAG_KEPT) and size > end:
        raise CodecError("request record with no rows, or that keeps its running set, carries ids")
    return step, ts, n, flags, end


class RequestRecords:
    """One ring's ``R`` records decoded in order: a record that keeps its running set's columns
    (``FLAG_KEPT``) gets those of the last full record read. The set's small columns are copied
    out of that record when the first record keeping it is read, once per running set.

    A kept record before any full one (a reader that started inside the ring), or after a break
    in the ring's records, is set aside and counted (``set_aside``): the writer writes a full
    record at least every ``KEPT_MAX`` + 1. A break is seen by place: given each record's place
    (``breaks``, every record of the ring, whatever its tag), one that does not start where the
    last one ended (records lost to the writer, skipped as corrupt, dropped unread, or read and
    thrown away) drops the set held, unless the writer padded the end of a lap there."""

    __slots__ = ("_full", "_next", "_set", "_view", "capacity", "set_aside")

    def __init__(self, capacity: int = 0) -> None:
        self._full: RequestBlock | None = None
        self._view: bytes | memoryview | None = None  # the full record's payload, while this read lasts
        self._set: RunningSet | None = None
        self._next = -1  # where the next record of the ring starts (-1: not known)
        self.capacity = capacity  # the ring's (0: not known; a lap's padding then reads as a break)
        self.set_aside = 0

    def reset(self) -> None:
        """Records were lost since the last one read: the set held may no longer be the writer's."""
        self._full = self._set = self._view = None

    def read_done(self) -> None:
        """The read whose payloads were handed in is over: none of them is held past it (a view
        would pin the read's buffer)."""
        self._view = None

    def breaks(self, places: Sequence[int], payloads: Sequence[bytes | memoryview]) -> list[int]:
        """A read's records, in order (``places``: each one's logical offset in the ring,
        ``payloads``: its bytes): the indices of those that do not start where the record
        before them ended (the last read's last record, for the first), in order, for the
        reader to ``reset`` at; a record after the writer's padding of a lap's end is no
        break. One list comparison for a read without a break."""
        n = len(places)
        if not n:
            return []
        nexts = [at + ((_REC_HEADER + size + 7) & ~7) for at, size in zip(places, map(len, payloads), strict=True)]
        out: list[int] = []
        if self._next >= 0 and places[0] != self._next and not self._padded(places[0], self._next, nexts[0] - places[0]):
            out.append(0)
        if n > 1 and list(places[1:]) != nexts[:-1]:
            out += [i for i in range(1, n) if places[i] != nexts[i - 1] and not self._padded(places[i], nexts[i - 1], nexts[i] - places[i])]
        self._next = nexts[-1]
        return out

    def _padded(self, place: int, expected: int, size: int) -> bool:
        """Whether a record at ``place``, where one at ``expected`` was due, follows the writer's
        padding of a lap's end."""
        cap = self.capacity
        return bool(cap) and place % cap == 0 and 0 < place - expected < size

    def block(self, payload: bytes | memoryview, ring: RingRecords | None = None, place: int = 0) -> RequestBlock | None:
        """The block of an ``R`` payload (left in ``ring`` at ``place`` when a ring is given);
        None for a kept record whose set is not known. A record that does not add up is a
        ``CodecError``, and the set held is dropped."""
        try:
            if len(payload) >= _HEAD and payload[_HEAD - 1] & FLAG_KEPT:
                kept = self._running_set()
                if kept is None:
                    self.set_aside += 1
                    return None
                return RequestBlock.in_ring(payload, ring, place, kept) if ring is not None else RequestBlock.from_payload(payload, kept=kept)
            block = RequestBlock.in_ring(payload, ring, place) if ring is not None else RequestBlock.from_payload(payload, self._full)
        except CodecError:
            self.reset()  # (a full record that does not add up may have been the set's)
            raise
        self._full, self._set, self._view = block, None, payload
        return block

    def _running_set(self) -> RunningSet | None:
        if self._set is None and self._full is not None:
            view = self._view
            if view is not None:  # the full record came in this read: its bytes are at hand
                end = _HEAD + _width(self._full.flags) * self._full.n
                self._set = RunningSet(self._full, view[_HEAD:end], view[end:])
                return self._set
            parts = self._full.parts()
            if parts is None:  # (its ring overwrote it: never within the writer's KEPT_MAX records)
                self._full = None
                return None
            self._set = RunningSet(self._full, *parts)
        return self._set


def decode_columns(blocks: Sequence[StepRequests]) -> dict[str, list[Any]]:
    """The blocks' rows as the export's columns: per-block C work (``array.tolist``, ``split``,
    ``map`` over a table for the status names); per-row Python only for -1 (unknown) values.

    A block whose ids do not number its rows (a writer's bug: the ring's CRC vouches for the
    bytes, not for what they say) gets null ids, and a warning names its steps."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    bad: list[int] = []
    gone: list[int] = []
    has_mirror = any(b.flags & FLAG_MIRROR for b in blocks)
    has_host = any(b.flags & FLAG_HOST_BLOCKS for b in blocks)
    for b in blocks:
        n = b.n
        if not n:
            continue
        parts = _parts(b)
        if parts is None:  # left in its ring, which no longer holds it
            gone.append(b.step)
            continue
        raw, id_bytes = parts
        cols["step"].extend([b.step] * n)
        ids: list[str] | list[None] = id_bytes.decode("utf-8", "replace").split("\0")
        if len(ids) != n:
            bad.append(b.step)
            ids = [None] * n
        cols["request_id"].extend(ids)
        for i, name in enumerate(("prompt_len", "computed_tokens", "output_tokens", "preemptions")):
            a = array("I")
            a.frombytes(raw[4 * n * i : 4 * n * (i + 1)])
            cols[name].extend(a.tolist())
        cols["status"].extend(map(_STATUS_OF_BYTE.__getitem__, raw[16 * n : 17 * n]))
        pos = 17 * n
        for flag, name, present in ((FLAG_MIRROR, "mirror_rows", has_mirror), (FLAG_HOST_BLOCKS, "host_blocks", has_host)):
            if b.flags & flag:
                a = array("i")
                a.frombytes(raw[pos : pos + 4 * n])
                pos += 4 * n
                cols[name].extend([None if v < 0 else v for v in a] if a.count(-1) else a.tolist())
            elif present:
                cols[name].extend([None] * n)
    if not has_mirror:
        cols["mirror_rows"] = [None] * len(cols["step"])
    if not has_host:
        cols["host_blocks"] = [None] * len(cols["step"])
    if bad:
        log.warning("%d request blocks' ids do not match their rows (steps %s): their request ids are null", len(bad), bad[:5])
    if gone:
        log.warning("%d request blocks were overwritten in their ring before they were read (steps %s)", len(gone), gone[:5])
    return cols


def _parts(block: StepRequests) -> tuple[bytes, bytes] | None:
    parts = getattr(block, "parts", None)
    return parts() if parts is not None else (block.cols, block.ids)


# -- the snapshot part: the blocks as the recorder wrote them -----------------------------------
# Stored uncompressed by default: zlib at its fastest level took 127 ms for a full 8 MiB of
# blocks at 256 running requests with vLLM-like random ids (8.3 -> 3.0 MB), a quarter of the
# 500 ms fault-to-durable-snapshot budget, twice per fault (first commit and amendment), and a
# node's faults come in bursts (bench/bench_freeze.py --random-ids, bench/bench_node.py). A stored part is therefore at
# most ``ring_request_bytes`` (8 MiB by default) per engine snapshot.
BLOB_MAGIC = b"FLRB1\n"  # then zlib( u32 length | R payload, ... )
RAW_MAGIC = b"FLRB0\n"  # then u32 length | R payload, ...
_U32 = struct.Struct("<I")


def pack_blocks(blocks: Sequence[StepRequests], level: int = 0) -> bytes:
    """The ``requests`` part of a snapshot as stored: the recorder's own bytes (``level`` 0:
    as they are; 1-9: zlib). Decoded to columns when read (``unpack_blocks`` + ``decode_columns``)."""
    pieces: list[bytes] = []
    for b in blocks:  # the payload's parts, not a copy of each (one join: one copy of it all)
        parts = _parts(b)
        if parts is None:  # left in its ring, which no longer holds it
            continue
        cols, ids = parts
        head = TAG_REQS + REQS_HEAD.pack(b.step, b.ts, b.n, b.flags)
        pieces += (_U32.pack(len(head) + len(cols) + len(ids)), head, cols, ids)
    raw = b"".join(pieces)
    if level <= 0:
        return RAW_MAGIC + raw
    return BLOB_MAGIC + zlib.compress(raw, level)


def unpack_blocks(blob: bytes, *, max_bytes: int = 1 << 31) -> list[RequestBlock]:
    if blob.startswith(RAW_MAGIC):
        raw = blob[len(RAW_MAGIC) :]
    elif blob.startswith(BLOB_MAGIC):
        d = zlib.decompressobj()
        raw = d.decompress(blob[len(BLOB_MAGIC) :], max_bytes)
        if d.unconsumed_tail:
            raise CodecError("request-block blob is larger than allowed")
    else:
        raise CodecError("not a request-block blob")
    out: list[RequestBlock] = []
    pos = 0
    prev: RequestBlock | None = None
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise CodecError("request-block blob is truncated")
        (length,) = _U32.unpack_from(raw, pos)
        pos += 4
        if pos + length > len(raw):
            raise CodecError("request-block blob is truncated")
        prev = RequestBlock.from_payload(raw[pos : pos + length], prev)
        out.append(prev)
        pos += length
    return out


def is_block_blob(blob: bytes) -> bool:
    return blob.startswith((RAW_MAGIC, BLOB_MAGIC))
