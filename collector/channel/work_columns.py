"""Internal: one ring read's ``W`` records (requests arriving and ending) as columns (sidecar
only: numpy).

An engine at 256 running writes about 1.6 ``W`` records a step (requests arriving and ending).
Decoded one by one (``codec.decode_work``: a struct unpack, a dozen checks and a named tuple
each) and filed one by one, a record costs about 1.7 us however many a read holds. Here a large
read's records (``COLUMNS_FROM`` or more: a ring's first catch-up, a sidecar that fell behind)
are checked with one structured array over their heads, and only the ids and finish reasons are
made one by one (they are strings): 1.0 us a record at 1,000 a read. The checks are ``codec.decode_work``'s; a read holding any record they refuse is
decoded record by record instead, so each refused record gets that function's own error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from collector.channel.codec import CodecError, decode_work
from collector.channel.wire import (
    _NULL_FLAG3,
    _NULL_FLAG4,
    _WORK_FLAGS,
    _WORK_NULLS,
    TAG_WORK,
    WORK_END,
    WORK_FINISH_MAX,
    WORK_HEAD,
    WORK_ID_MAX,
)
from collector.columns import INT64_NULL
from collector.model import WorkloadArrival, WorkloadEnd

__all__ = ["WorkColumns", "decode_work_records"]

# A W record's head as written: the tag, then WORK_HEAD (little endian, packed).
_HEAD = np.dtype(
    [
        ("tag", "u1"),
        ("event", "u1"),
        ("nulls", "u1"),
        ("flags", "u1"),
        ("id_len", "<u2"),
        ("ts", "<f8"),
        ("c0", "<i8"),
        ("c1", "<i8"),
        ("c2", "<i8"),
    ]
)
_SIZE = 1 + WORK_HEAD.size
assert _HEAD.itemsize == _SIZE
_AT = np.arange(_SIZE, dtype=np.int64)
_TAG = TAG_WORK[0]
_NONE = INT64_NULL  # an unknown count
# Fewer records than this are decoded one by one: a numpy operation costs about a microsecond
# whatever its length, and the ~40 here outweigh the records' own Python work below about this
# many (``bench/bench_work_records.py``, decoded and filed, us per record: at 30 a read 4.2 as
# columns against 2.0 one by one; at 100, 1.8 against 1.75; at 300, 1.2 against 1.7; at 1,000,
# 1.0 against 1.7, as in a ring's first catch-up). A node-scale read (one a second) holds about 200.
COLUMNS_FROM = 128


class WorkColumns(Sequence[WorkloadArrival | WorkloadEnd]):
    """A read's arrivals and ends in the order written, as columns: ``is_end``; ``ts``; ``a``,
    ``b``, ``c`` (an arrival's prompt length, max tokens and ``n``; an end's output length and
    cached tokens, ``c`` unused), ``INT64_NULL`` where unknown; ``f1``, ``f2`` (an arrival's
    ``ignore_eos`` and ``has_stop``: -1 unknown, 0, 1); ``ids``; ``finish`` (each record's finish
    reason: None for an arrival or where unknown). As a sequence it reads as the records
    ``codec.decode_work`` makes, built when asked for (tests, tools); the workload log files the
    columns."""

    __slots__ = ("a", "b", "c", "f1", "f2", "finish", "ids", "is_end", "ts")

    def __init__(
        self,
        *,
        is_end: npt.NDArray[np.bool_],
        ts: npt.NDArray[np.float64],
        a: npt.NDArray[np.int64],
        b: npt.NDArray[np.int64],
        c: npt.NDArray[np.int64],
        f1: npt.NDArray[np.int8],
        f2: npt.NDArray[np.int8],
        ids: list[str],
        finish: list[str | None],
    ) -> None:
        self.is_end, self.ts, self.a, self.b, self.c, self.f1, self.f2 = is_end, ts, a, b, c, f1, f2
        self.ids, self.finish = ids, finish

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> WorkloadArrival | WorkloadEnd: ...
    @overload
    def __getitem__(self, i: slice) -> list[WorkloadArrival | WorkloadEnd]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._record(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._record(i % n)

    def __iter__(self) -> Iterator[WorkloadArrival | WorkloadEnd]:
        return (self._record(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WorkColumns({list(self)!r})"

    def _record(self, i: int) -> WorkloadArrival | WorkloadEnd:
        a, b = int(self.a[i]), int(self.b[i])
        if self.is_end[i]:
            return WorkloadEnd(self.ids[i], float(self.ts[i]), None if a == _NONE else a, self.finish[i], None if b == _NONE else b)
        c, f1, f2 = int(self.c[i]), int(self.f1[i]), int(self.f2[i])
        return WorkloadArrival(
            self.ids[i],
            float(self.ts[i]),
            None if a == _NONE else a,
            None if b == _NONE else b,
            None if c == _NONE else c,
            None if f1 < 0 else bool(f1),
            None if f2 < 0 else bool(f2),
        )


def decode_work_records(payloads: Sequence[bytes | memoryview]) -> tuple[Sequence[WorkloadArrival | WorkloadEnd], list[CodecError]]:
    """A read's ``W`` records, in order: their sound records (``WorkColumns``, or a list where
    some record was refused) and the errors of those refused."""
    if not payloads:
        return [], []
    cols = _columns(payloads) if len(payloads) >= COLUMNS_FROM else None
    if cols is not None:
        return cols, []
    records: list[WorkloadArrival | WorkloadEnd] = []
    errors: list[CodecError] = []
    for p in payloads:
        try:
            records.append(decode_work(p))
        except CodecError as exc:
            errors.append(exc)
    return records, errors


def _columns(payloads: Sequence[bytes | memoryview]) -> WorkColumns | None:
    """The records as columns; None when any is refused or needs a closer look (its finish
    reason longer than its limit in bytes, which may still fit in characters)."""
    n = len(payloads)
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
    if int(sizes.min()) < _SIZE:
        return None
    blob = b"".join(payloads)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    heads = np.frombuffer(blob, dtype=np.uint8)[starts[:, None] + _AT].view(_HEAD).reshape(n)
    event, nulls, flags, id_len, ts = heads["event"], heads["nulls"], heads["flags"], heads["id_len"].astype(np.int64), heads["ts"]
    c0, c1, c2 = heads["c0"], heads["c1"], heads["c2"]
    is_end = event == WORK_END
    text_end = _SIZE + id_len
    reason_len = sizes - text_end
    ok = (heads["tag"] == _TAG) & (event <= WORK_END)
    ok &= (nulls & ~np.where(is_end, _WORK_NULLS[WORK_END], _WORK_NULLS[0])) == 0
    ok &= (flags & ~np.where(is_end, _WORK_FLAGS[WORK_END], _WORK_FLAGS[0])) == 0
    ok &= ~is_end | (c2 == 0)
    ok &= (id_len > 0) & (id_len <= WORK_ID_MAX) & (reason_len >= 0) & (is_end | (reason_len == 0))
    ok &= reason_len <= WORK_FINISH_MAX
    ok &= np.isfinite(ts) & (ts >= 0)
    ok &= (c0 >= 0) & (c1 >= 0) & (c2 >= 0)
    ok &= ((nulls & 1) == 0) | (c0 == 0)
    ok &= ((nulls & 2) == 0) | (c1 == 0)
    ok &= ((nulls & 4) == 0) | (c2 == 0)
    ok &= ((nulls & _NULL_FLAG3) == 0) | ((reason_len == 0) & ((flags & 1) == 0))
    ok &= ((nulls & _NULL_FLAG4) == 0) | ((flags & 2) == 0)
    if not ok.all():
        return None
    text_at = (starts + _SIZE).tolist()
    text_to = (starts + text_end).tolist()
    # The texts are sliced out of the blob decoded once as Latin-1 (a character a byte: the
    # offsets hold), then checked to be ASCII, which reads the same in UTF-8; a read with any
    # other text decodes each one as UTF-8.
    text = blob.decode("latin-1")
    ids = [text[i:j] for i, j in zip(text_at, text_to, strict=True)]
    finish: list[str | None] = [None] * n
    known: list[int] = []
    if is_end.any():
        ends = np.flatnonzero(is_end)
        known = ends[(nulls[ends] & _NULL_FLAG3) == 0].tolist()
        to = (starts + sizes).tolist()
        for i in known:
            finish[i] = text[text_to[i] : to[i]]
    joined = "".join(ids) + "".join([finish[i] for i in known])  # type: ignore[misc]
    if not joined.isascii():
        try:
            ids = [blob[i:j].decode() for i, j in zip(text_at, text_to, strict=True)]
            for i in known:
                finish[i] = blob[text_to[i] : to[i]].decode()
        except UnicodeDecodeError:
            return None
        joined = "".join(ids) + "".join([finish[i] for i in known])  # type: ignore[misc]
    if "\0" in joined:
        return None
    return WorkColumns(
        is_end=is_end,
        ts=ts.copy(),
        a=np.where(nulls & 1, _NONE, c0),
        b=np.where(nulls & 2, _NONE, c1),
        c=np.where(nulls & 4, _NONE, c2),
        f1=np.where(nulls & _NULL_FLAG3, -1, flags & 1).astype(np.int8),
        f2=np.where(nulls & _NULL_FLAG4, -1, (flags >> 1) & 1).astype(np.int8),
        ids=ids,
        finish=finish,
    )
