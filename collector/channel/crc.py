"""Internal: zlib's CRC-32 of records that end the same way, record after record, without reading the end
again: the writer's half of the ring's CRC for ``R`` records, whose ids, statuses and other
columns stay the same while the running set does (three quarters of the record at 256 running).

CRC-32 is linear over GF(2): for a record ``P + S``,
``crc(P + S) = shift_|S|(raw(P)) ^ raw(S)`` on the raw register (zlib's pre- and post-inversion
aside), where ``shift_L`` is the register's advance over ``L`` zero bytes, a linear map of 32
bits. ``SuffixCrc`` holds ``raw(S)`` and ``shift_|S|`` (four 256-entry tables, one per byte of the
register, built from one ``zlib.crc32`` over ``|S|`` zeros and kept per length), so a record
costs ``zlib.crc32(P)`` and four table lookups instead of ``zlib.crc32(P + S)``. The result is the same number: the ring's
format does not change.
"""

from __future__ import annotations

import zlib

__all__ = ["SuffixCrc"]

_M = 0xFFFFFFFF
_POLY = 0xEDB88320  # zlib's polynomial, bit-reflected
_SHIFTS: dict[int, tuple[tuple[int, ...], ...]] = {}
_MAX_SHIFTS = 16  # lengths kept (40 kB of tables each)


def _shift_tables(length: int) -> tuple[tuple[int, ...], ...]:
    """The raw register's advance over ``length`` zero bytes, as 4 tables of 256 (one per byte)."""
    tables = _SHIFTS.get(length)
    if tables is not None:
        return tables
    # Where the register's top bit goes over `length` zero bytes; each lower bit is that image
    # advanced by one more zero bit (one bit lower is one bit step earlier), so the 32 images of
    # the basis come from one crc32 over zeros.
    v = zlib.crc32(bytes(length), 0x80000000 ^ _M) ^ _M
    basis = [0] * 32
    for j in range(31, -1, -1):
        basis[j] = v
        v = (v >> 1) ^ (_POLY if v & 1 else 0)
    out = []
    for k in range(4):
        t = [0] * 256
        for x in range(1, 256):
            low = x & -x
            t[x] = t[x ^ low] ^ basis[8 * k + low.bit_length() - 1]
        out.append(tuple(t))
    if len(_SHIFTS) >= _MAX_SHIFTS:
        _SHIFTS.clear()
    tables = _SHIFTS[length] = tuple(out)
    return tables


class SuffixCrc:
    """``zlib.crc32(prefix + suffix)`` for one ``suffix`` and any prefix, at the cost of
    ``zlib.crc32(prefix)``::

        tail = SuffixCrc(ids)
        assert tail.crc(head) == zlib.crc32(head + ids)
    """

    __slots__ = ("suffix", "_raw", "_t")

    def __init__(self, suffix: bytes) -> None:
        self.suffix = suffix
        self._raw = zlib.crc32(suffix, _M)  # the raw register over the suffix from 0, post-inverted
        self._t = _shift_tables(len(suffix))

    def crc(self, prefix: bytes) -> int:
        r = zlib.crc32(prefix) ^ _M  # the raw register after the prefix
        t0, t1, t2, t3 = self._t
        return t0[r & 255] ^ t1[r >> 8 & 255] ^ t2[r >> 16 & 255] ^ t3[r >> 24] ^ self._raw
