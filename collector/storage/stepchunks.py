"""Step chunks: the stored form of an engine's steps, a few seconds of them per row.

A chunk is one engine's steps of one run within one ``CHUNK_S`` window of time, as the columns
of ``collector.columns.STEP_DTYPE`` packed into one blob (``ENCODING``): each integer column as
its differences from the step before, each float column as the XOR of its bits with the step
before's (lossless, NaN included), every column's bytes transposed (the high bytes, mostly
zero, side by side) and the whole zlib-compressed. A busy engine's step (13 figures, 60 bytes
raw, 100-odd bytes as a row with its two indexes) is 7-10 bytes in a chunk.

Decoding gives back the exact columns: unknown stays ``INT_NULL``/NaN (None to readers).

Sidecar only (numpy).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collector.columns import STEP_COLUMNS, STEP_DTYPE

__all__ = ["CHUNK_S", "ENCODING", "Chunk", "chunks_of", "decode", "encode"]

# The encoding's name, stored beside each blob: a new layout gets a new name, and readers keep
# decoding the old ones.
ENCODING = "dx-shuffle-zlib1"
# A chunk holds steps of one aligned window this long: retention deletes whole chunks, so this
# is also how far past its horizon a step may stay.
CHUNK_S = 10.0
_LEVEL = 1  # 10% larger than 6 and half the CPU: the budget holds either way, the CPU goal is the harder one


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk's keys (what the readers and the duplicate check index) and its steps."""

    run: int
    first_step: int
    last_step: int
    ts_min: float
    ts_max: float
    cols: npt.NDArray[np.void]


def encode(cols: npt.NDArray[np.void]) -> bytes:
    """``cols`` (``STEP_DTYPE``) as one blob; ``decode(blob, len(cols))`` gives it back."""
    parts = []
    for name in STEP_COLUMNS:
        col = np.ascontiguousarray(cols[name])
        if col.dtype.kind == "f":
            col = col.view("<u8")
            d = np.empty_like(col)
            np.bitwise_xor(col[1:], col[:-1], out=d[1:])
        else:
            d = np.empty_like(col)
            np.subtract(col[1:], col[:-1], out=d[1:])  # wraps in the column's width: undone exactly
        d[:1] = col[:1]
        parts.append(d.view(np.uint8).reshape(len(d), d.dtype.itemsize).T.tobytes())
    return zlib.compress(b"".join(parts), _LEVEL)


def decode(blob: bytes, n: int, encoding: str = ENCODING) -> npt.NDArray[np.void]:
    """The ``n`` steps of a blob made by ``encode``. Raises ValueError for a blob that is not one."""
    if encoding != ENCODING:
        raise ValueError(f"unknown step chunk encoding {encoding!r}")
    try:
        raw = zlib.decompress(blob)
    except zlib.error as exc:
        raise ValueError(f"step chunk: {exc}") from exc
    if len(raw) != n * STEP_DTYPE.itemsize:
        raise ValueError(f"step chunk: {len(raw)} bytes for {n} steps")
    cols = np.empty(n, dtype=STEP_DTYPE)
    at = 0
    for name in STEP_COLUMNS:
        dt = STEP_DTYPE[name]
        size = n * dt.itemsize
        shuffled = np.frombuffer(raw, dtype=np.uint8, count=size, offset=at).reshape(dt.itemsize, n)
        at += size
        back = np.ascontiguousarray(shuffled.T)
        if dt.kind == "f":
            cols[name] = np.bitwise_xor.accumulate(back.view("<u8").reshape(n)).view(dt)
        else:
            cols[name] = np.cumsum(back.view(dt).reshape(n), dtype=dt)
    return cols


def chunks_of(cols: npt.NDArray[np.void], *, chunk_s: float = CHUNK_S) -> Iterator[Chunk]:
    """``cols`` (one engine's steps, in step order) cut where the run or the ``chunk_s`` window
    of time changes."""
    n = len(cols)
    if not n:
        return
    window = np.floor(cols["ts"] / chunk_s)
    run = cols["run"]
    cut = np.flatnonzero((window[1:] != window[:-1]) | (run[1:] != run[:-1])) + 1
    for lo, hi in zip(np.concatenate(([0], cut)), np.concatenate((cut, [n])), strict=True):
        part = cols[lo:hi]
        steps, ts = part["step"], part["ts"]
        yield Chunk(int(part["run"][0]), int(steps.min()), int(steps.max()), float(np.nanmin(ts)), float(np.nanmax(ts)), part)
