from __future__ import annotations

import json
import math

import pytest

from collector.storage.scrapepack import pack, unpack


def test_figures_unpack_as_packed_and_smaller_than_json() -> None:
    values = {
        "num_requests_running": 256.0,
        'request_success_total{finished_reason="stop"}': 91234.0,
        "kv_cache_usage_perc": 0.8734567901234568,
        "rate:generation_tokens_total": 25600.0,
        "a name no dictionary knows": -1.5,
        "nan": math.inf,
    }
    blob = pack(values)
    assert unpack(blob) == values
    assert len(blob) < len(json.dumps(values)) / 2


@pytest.mark.parametrize("blob", [b"", b"\x02abc", b"\x01not zlib", pack({"a": 1})[:-3]])
def test_a_blob_that_is_not_packed_figures_is_a_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError):
        unpack(blob)
