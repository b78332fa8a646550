"""``SuffixCrc`` gives zlib's CRC-32 of prefix + suffix: the ring's CRC, not a look-alike."""

from __future__ import annotations

import random
import zlib

import pytest

from collector.channel.crc import SuffixCrc


@pytest.mark.parametrize("suffix_len", [0, 1, 3, 7, 8, 64, 4096, 13_823])
def test_equals_zlib_crc32_of_the_whole(suffix_len: int) -> None:
    rng = random.Random(suffix_len)
    suffix = rng.randbytes(suffix_len)
    tail = SuffixCrc(suffix)
    for prefix_len in (0, 1, 21, 3093, 5397):
        prefix = rng.randbytes(prefix_len)
        assert tail.crc(prefix) == zlib.crc32(prefix + suffix)


def test_random_lengths_and_contents() -> None:
    rng = random.Random(29)
    for _ in range(200):
        prefix, suffix = rng.randbytes(rng.randrange(0, 600)), rng.randbytes(rng.randrange(0, 3000))
        assert SuffixCrc(suffix).crc(prefix) == zlib.crc32(prefix + suffix)


def test_one_suffix_serves_many_prefixes_and_equal_lengths_share_tables() -> None:
    a, b = SuffixCrc(b"\x00" * 100), SuffixCrc(b"\xff" * 100)
    assert a.crc(b"x") != b.crc(b"x")  # the suffix's own contents count, not only its length
    assert (a.crc(b"x"), b.crc(b"y")) == (zlib.crc32(b"x" + b"\x00" * 100), zlib.crc32(b"y" + b"\xff" * 100))
