"""A scrape's figures as the store keeps them: JSON, zlib-compressed with a preset dictionary of
the names vLLM's pages use, in ``engine_scrapes.packed``. A busy engine's scrape (26 figures and
their rates, 1.2 kB as JSON) packs into about 200 bytes; every figure and rate is kept, and
``unpack`` gives back exactly the mapping ``pack`` took (NaN and infinities included).

The first byte names the format; the dictionary of format 1 never changes (a blob packed with it
must unpack forever): new names go into a format 2.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

__all__ = ["pack", "unpack"]

_FORMAT_1 = 1
# vLLM's sample names as the metrics source keys them (collector/sources/vllm_metrics.py), plain
# and as rates: the preset dictionary of format 1. Frozen.
_NAMES_1 = (
    "num_requests_running",
    "num_requests_waiting",
    "num_requests_waiting_by_reason",
    "kv_cache_usage_perc",
    "engine_sleep_state",
    "num_preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "iteration_tokens_total_sum",
    "iteration_tokens_total_count",
    "e2e_request_latency_seconds_sum",
    "e2e_request_latency_seconds_count",
    "time_to_first_token_seconds_sum",
    "time_to_first_token_seconds_count",
    "inter_token_latency_seconds_sum",
    "inter_token_latency_seconds_count",
)
_LABELLED_1 = (
    'num_requests_waiting_by_reason{reason="capacity"}',
    'num_requests_waiting_by_reason{reason="deferred"}',
    'engine_sleep_state{sleep_state="awake"}',
    'engine_sleep_state{sleep_state="weights_offloaded"}',
    'engine_sleep_state{sleep_state="discard_all"}',
    'request_success_total{finished_reason="stop"}',
    'request_success_total{finished_reason="length"}',
    'request_success_total{finished_reason="abort"}',
    'request_success_total{finished_reason="error"}',
    'request_success_total{finished_reason="repetition"}',
)
_ZDICT_1 = b", ".join(json.dumps(n).encode() + b": " for n in (*(f"rate:{n}" for n in _NAMES_1), *_NAMES_1, *_LABELLED_1))


def pack(values: dict[str, Any]) -> bytes:
    z = zlib.compressobj(6, zdict=_ZDICT_1)
    return bytes([_FORMAT_1]) + z.compress(json.dumps(values).encode()) + z.flush()


def unpack(blob: bytes) -> dict[str, Any]:
    """The mapping ``pack`` made ``blob`` of. Raises ValueError for a blob that is not one."""
    if not blob or blob[0] != _FORMAT_1:
        raise ValueError("unknown scrape packing")
    try:
        z = zlib.decompressobj(zdict=_ZDICT_1)
        text = z.decompress(blob[1:]) + z.flush()
        if not z.eof:
            raise ValueError("truncated")
        out = json.loads(text)
    except (zlib.error, ValueError) as exc:
        raise ValueError(f"scrape packing: {exc}") from exc
    if not isinstance(out, dict):
        raise ValueError("scrape packing: not a mapping")
    return out
