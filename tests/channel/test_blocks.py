from __future__ import annotations

import pytest

from collector.channel.blocks import RequestBlock, decode_columns, pack_blocks, unpack_blocks
from collector.channel.codec import CodecError
from tests.request_columns import Row, make_block


def _blocks() -> list[RequestBlock]:
    out: list[RequestBlock] = []
    for step in range(3):
        rows = [Row("cmpl-a-0", 100, 10 + step, step, 0, "running", 2, 5), Row("cmpl-b-0", 50, 5, 0, 1, "preempted", None, None)]
        out.append(make_block(step, float(step), rows, out[-1] if out else None))
    return out


@pytest.mark.parametrize("level", [0, 1])
def test_stored_blocks_read_back_to_the_same_columns_raw_or_compressed(level: int) -> None:
    blocks = _blocks()
    assert blocks[1].ids is blocks[0].ids  # a stable running set's ids are held once
    back = unpack_blocks(pack_blocks(blocks, level=level))
    assert decode_columns(back) == decode_columns(blocks)
    cols = decode_columns(back)
    assert cols["computed_tokens"] == [10, 5, 11, 5, 12, 5]
    assert cols["mirror_rows"] == [2, None] * 3 and cols["host_blocks"] == [5, None] * 3
    assert (blocks[0].running, blocks[0].mirror_rows, blocks[0].host_blocks) == (1, 2, 5)


def test_a_torn_or_foreign_blob_is_our_error() -> None:
    blob = pack_blocks(_blocks())
    for bad in (blob[:-3], b"FLRB0\n\x05\x00", b"not ours"):
        with pytest.raises(CodecError):
            unpack_blocks(bad)
