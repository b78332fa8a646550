"""vLLM's periodic stat line (every 10 s while busy) -> a dict of numbers.

Real line (vLLM 0.32 CPU, ``vllm/v1/metrics/loggers.py:LoggingStatLogger.log``)::

    Engine 000: Avg prompt throughput: 908.7 tokens/s, Avg generation throughput: 950.8
    tokens/s, Running: 32 reqs, Waiting: 0 reqs, CPU KV cache usage: 1.6%, Prefix cache hit
    rate: 2.8%

Fields that 0.32 adds only when non-zero or enabled, in this order: ``Deferred: N reqs``,
``KV fetch: A waiting to start, B in progress, C completed waiting``, ``Preemptions: N``,
``Prefix cache hit rate``, ``Corrupted: N reqs``, ``External prefix cache hit rate``,
``MM cache hit rate``. GPU builds say ``GPU KV cache usage``. Each field is matched on its
own, so a field added by a later vLLM is ignored rather than breaking the line.

Keys use the names of the ``/metrics`` families where one exists, so this low-rate series can
stand in for a scrape: percentages become fractions (``kv_cache_usage_perc`` 0.016).
"""

from __future__ import annotations

import re

from collector.errors import InputError

_ENGINE = re.compile(r"Engine (\d{1,6}): Avg prompt throughput: ")
_NUM = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)"

# (regex, key, scale): scale 0.01 turns a percentage into a fraction.
_FIELDS: tuple[tuple[re.Pattern[str], str, float], ...] = (
    (re.compile(r"Avg prompt throughput: " + _NUM + r" tokens/s"), "prompt_throughput", 1.0),
    (
        re.compile(r"Avg generation throughput: " + _NUM + r" tokens/s"),
        "generation_throughput",
        1.0,
    ),
    (re.compile(r"\bRunning: " + _NUM + r" reqs"), "num_requests_running", 1.0),
    (re.compile(r"\bWaiting: " + _NUM + r" reqs"), "num_requests_waiting", 1.0),
    (re.compile(r"\bDeferred: " + _NUM + r" reqs"), "num_requests_deferred", 1.0),
    (re.compile(r"\bPreemptions: " + _NUM), "num_preemptions", 1.0),
    (re.compile(r"\b[A-Z]+ KV cache usage: " + _NUM + "%"), "kv_cache_usage_perc", 0.01),
    (
        re.compile(r"\bPrefix cache hit rate: " + _NUM + "%"),
        "prefix_cache_hit_rate",
        0.01,
    ),
    (
        re.compile(r"External prefix cache hit rate: " + _NUM + "%"),
        "external_prefix_cache_hit_rate",
        0.01,
    ),
    (re.compile(r"MM cache hit rate: " + _NUM + "%"), "mm_cache_hit_rate", 0.01),
    (re.compile(r"\bCorrupted: " + _NUM + r" reqs"), "num_corrupted_requests", 1.0),
)
_KV_FETCH = re.compile(r"KV fetch: (\d+) waiting to start, (\d+) in progress, (\d+) completed waiting")
_DEVICE = re.compile(r"\b([A-Z]+) KV cache usage: ")


class ThroughputLineError(InputError):
    """The text is not vLLM's periodic stat line."""


def is_throughput_line(message: str) -> bool:
    return _ENGINE.search(message) is not None


def parse_throughput_line(message: str) -> dict[str, float | str]:
    """Parse the message part of the stat line (the header may be left on).

    Returns ``engine_index`` and every field present; ``kv_cache_device`` is "CPU" or "GPU".
    Raises ThroughputLineError when the line is not a stat line.
    """
    if not isinstance(message, str):
        raise ThroughputLineError(f"not text: {type(message).__name__}")
    m = _ENGINE.search(message)
    if m is None:
        raise ThroughputLineError("no 'Engine NNN: Avg prompt throughput:' in line")
    body = message[m.start() :]
    out: dict[str, float | str] = {"engine_index": float(int(m.group(1)))}
    for pattern, key, scale in _FIELDS:
        found = pattern.search(body)
        if found is not None:
            out[key] = float(found.group(1)) * scale
    fetch = _KV_FETCH.search(body)
    if fetch is not None:
        out["kv_fetch_waiting_to_start"] = float(fetch.group(1))
        out["kv_fetch_in_progress"] = float(fetch.group(2))
        out["kv_fetch_completed_waiting"] = float(fetch.group(3))
    device = _DEVICE.search(body)
    if device is not None:
        out["kv_cache_device"] = device.group(1)
    if "prompt_throughput" not in out:
        raise ThroughputLineError("stat line without a prompt throughput value")
    return out
