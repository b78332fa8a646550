"""Step chunks: a chunk decodes to exactly the columns it was made of, and batches are cut at
each window of time and each run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collector.columns import batch_from_rows
from collector.storage.stepchunks import CHUNK_S, ENCODING, chunks_of, decode, encode
from tests.storage.test_steps import _rows


def test_a_chunk_decodes_to_exactly_its_columns() -> None:
    cols = batch_from_rows("e", _rows(300)).cols
    cols["running"][3] = 2**31 - 1  # the widest a column holds: the differences wrap and unwrap
    cols["kv_cache_usage"][4] = -0.0
    back = decode(encode(cols), len(cols))
    assert back.tobytes() == cols.tobytes()
    assert decode(encode(cols[:0]), 0).shape == (0,)


def test_chunks_are_cut_at_each_window_and_run() -> None:
    rows = _rows(100, start=995.0) + _rows(5, start=1001.0, run=8)
    chunks = list(chunks_of(batch_from_rows("e", rows).cols))
    assert sum(len(c.cols) for c in chunks) == 105
    for c in chunks:
        assert len({math.floor(t / CHUNK_S) for t in c.cols["ts"]}) == 1 and set(c.cols["run"]) == {c.run}
        assert (c.first_step, c.last_step) == (int(c.cols["step"].min()), int(c.cols["step"].max()))


def test_a_blob_that_is_not_a_chunk_is_a_value_error() -> None:
    cols = batch_from_rows("e", _rows(10)).cols
    blob = encode(cols)
    for bad, n, encoding in ((b"junk", 10, ENCODING), (blob, 11, ENCODING), (blob, 10, "other")):
        with pytest.raises(ValueError):
            decode(bad, n, encoding)
    out = np.empty(10, dtype=cols.dtype)
    decode(blob, 10, out=out)
    assert out.tobytes() == cols.tobytes()
