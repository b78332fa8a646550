"""The stored form of a snapshot's parts: gzip members whose deflate body ends on a full flush,
so stored parts are spliced into one gzip stream without decompressing them
(``assemble_gzip``), with the CRC-32 of the whole computed from the parts' (``crc32_combine``).
Pure byte work; what the parts mean is ``collector.snapshot.document``."""

from __future__ import annotations

import gc
import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_GZ_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0, OS unknown
_EMPTY_FINAL_BLOCK = b"\x03\x00"  # a fixed-Huffman final block holding only end-of-block
_LEVEL = 1  # JSON of engine steps compresses ~10x at level 1 for a fraction of level 6's time


def _json_default(obj: Any) -> Any:
    to_json = getattr(obj, "to_json", None)  # a RequestTable
    return to_json() if callable(to_json) else str(obj)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=_json_default).encode()


@dataclass(frozen=True)
class Segment:
    """A raw deflate body ending on a byte boundary, with the CRC-32 and length of its text."""

    body: bytes
    crc: int
    length: int


def deflate_segment(raw: bytes, level: int = _LEVEL) -> Segment:
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return Segment(c.compress(raw) + c.flush(zlib.Z_FULL_FLUSH), zlib.crc32(raw), len(raw))


def pack(obj: Any) -> bytes:
    """gzip of the JSON of ``obj``, readable by any gzip reader, whose deflate body ends on a
    full flush followed by an empty final block, so ``segment_of`` can take the body out."""
    gc_was = gc.isenabled()
    gc.disable()  # encoding allocates no cycles; full collections would walk the sidecar's heap
    try:
        raw = obj.json_bytes() if hasattr(obj, "json_bytes") else dumps(obj)
    finally:
        if gc_was:
            gc.enable()
    seg = deflate_segment(raw)
    return _GZ_HEADER + seg.body + _EMPTY_FINAL_BLOCK + struct.pack("<II", seg.crc, seg.length & 0xFFFFFFFF)


def segment_of(blob: bytes) -> Segment | None:
    """The spliceable body of a blob written by ``pack``; None for any other gzip."""
    if len(blob) < 20 or blob[:10] != _GZ_HEADER or blob[-10:-8] != _EMPTY_FINAL_BLOCK:
        return None
    crc, length = struct.unpack("<II", blob[-8:])
    return Segment(blob[10:-10], crc, length)


def unpack(blob: bytes) -> Any:
    return json.loads(zlib.decompress(blob, 47))


# CRC-32 of A+B from crc(A), crc(B) and len(B) (zlib's crc32_combine, absent from Python 3.11's
# zlib): the effect of appending n zero bytes is a linear operator over GF(2); we keep the
# operators for 2^k bytes so a combine is at most 64 matrix-vector products.
def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def _zero_operators() -> list[list[int]]:
    op = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        op = _gf2_square(op)  # 2, 4, 8 bits: one zero byte
    ops = [op]
    for _ in range(63):
        ops.append(_gf2_square(ops[-1]))
    return ops


_ZERO_OPS = _zero_operators()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(_ZERO_OPS[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


def assemble_gzip(pieces: Sequence[bytes | Segment]) -> bytes:
    """One gzip member of the concatenated texts: ``bytes`` pieces are compressed here, stored
    segments are copied as they are."""
    out = [_GZ_HEADER]
    crc, total = 0, 0
    for piece in pieces:
        seg = piece if isinstance(piece, Segment) else deflate_segment(piece)
        out.append(seg.body)
        crc = crc32_combine(crc, seg.crc, seg.length)
        total += seg.length
    out.append(_EMPTY_FINAL_BLOCK + struct.pack("<II", crc, total & 0xFFFFFFFF))
    return b"".join(out)
