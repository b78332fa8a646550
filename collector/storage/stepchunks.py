"""Step chunks: the stored form of an engine's steps, a few seconds of them per row.

A chunk is one engine's steps of one run within one ``CHUNK_S`` window of time, as the columns
of ``collector.columns.STEP_DTYPE`` packed into one blob (``ENCODING``): each integer column as
its differences from the step before, each float column as the XOR of its bits with the step
before's (lossless, NaN included), every column's bytes transposed (the high bytes, mostly
zero, side by side), the 8-byte columns first, and the whole zlib-compressed. A busy engine's step (13 figures, 60 bytes
raw, 100-odd bytes as a row with its two indexes) is 7-10 bytes in a chunk.

Decoding gives back the exact columns: unknown stays ``INT_NULL``/NaN (None to readers).

Sidecar only (numpy).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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


# The columns by width: the 8-byte ones (times, step numbers, KV usage) as one block, then the
# 4-byte ones (counts), each block a 2-D array coded in a few array operations.
_WIDE = tuple(n for n in STEP_COLUMNS if STEP_DTYPE[n].itemsize == 8)
_NARROW = tuple(n for n in STEP_COLUMNS if STEP_DTYPE[n].itemsize == 4)
_WIDE_FLOAT = np.array([STEP_DTYPE[n].kind == "f" for n in _WIDE])
if len(_WIDE) + len(_NARROW) != len(STEP_COLUMNS) or any(STEP_DTYPE[n].kind != "i" for n in _NARROW):
    raise ImportError("stepchunks: a step column of a width or kind this encoding does not know")


def _shuffled(d: npt.NDArray[Any], width: int) -> bytes:
    """Rows of ``d`` with each row's bytes transposed (byte 0 of every value, then byte 1...)."""
    k, n = d.shape
    return d.view(np.uint8).reshape(k, n, width).transpose(0, 2, 1).tobytes()


def encode(cols: npt.NDArray[np.void]) -> bytes:
    """``cols`` (``STEP_DTYPE``) as one blob; ``decode(blob, len(cols))`` gives it back."""
    n = len(cols)
    wide = np.empty((len(_WIDE), n), dtype="<u8")
    for i, name in enumerate(_WIDE):
        wide[i] = cols[name].view("<u8")
    d = wide.copy()
    ints = ~_WIDE_FLOAT
    d[ints, 1:] = wide[ints, 1:] - wide[ints, :-1]  # wraps modulo 2**64: undone exactly
    d[_WIDE_FLOAT, 1:] = wide[_WIDE_FLOAT, 1:] ^ wide[_WIDE_FLOAT, :-1]  # a float's bits XOR the one before's
    narrow = np.empty((len(_NARROW), n), dtype="<i4")
    for i, name in enumerate(_NARROW):
        narrow[i] = cols[name]
    dn = narrow.copy()
    dn[:, 1:] = narrow[:, 1:] - narrow[:, :-1]
    return zlib.compress(_shuffled(d, 8) + _shuffled(dn, 4), _LEVEL)


def decode(blob: bytes, n: int, encoding: str = ENCODING, *, out: npt.NDArray[np.void] | None = None) -> npt.NDArray[np.void]:
    """The ``n`` steps of a blob made by ``encode``, written into ``out`` (``n`` steps of
    ``STEP_DTYPE``) when given. Raises ValueError for a blob that is not one."""
    if encoding != ENCODING:
        raise ValueError(f"unknown step chunk encoding {encoding!r}")
    try:
        raw = zlib.decompress(blob)
    except zlib.error as exc:
        raise ValueError(f"step chunk: {exc}") from exc
    kw, kn = len(_WIDE), len(_NARROW)
    if n < 0 or len(raw) != n * (8 * kw + 4 * kn):
        raise ValueError(f"step chunk: {len(raw)} bytes for {n} steps")
    b = np.frombuffer(raw, dtype=np.uint8)
    # copies (the blob's buffer is read-only): the transposes back, then in place
    wide = b[: 8 * kw * n].reshape(kw, 8, n).transpose(0, 2, 1).copy().view("<u8").reshape(kw, n)
    ints = ~_WIDE_FLOAT
    wide[ints] = np.cumsum(wide[ints], axis=1, dtype="<u8")
    wide[_WIDE_FLOAT] = np.bitwise_xor.accumulate(wide[_WIDE_FLOAT], axis=1)
    narrow = b[8 * kw * n :].reshape(kn, 4, n).transpose(0, 2, 1).copy().view("<i4").reshape(kn, n)
    narrow = np.cumsum(narrow, axis=1, dtype="<i4")
    cols = np.empty(n, dtype=STEP_DTYPE) if out is None else out
    for i, name in enumerate(_WIDE):
        cols[name] = wide[i].view(STEP_DTYPE[name])
    for i, name in enumerate(_NARROW):
        cols[name] = narrow[i]
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
