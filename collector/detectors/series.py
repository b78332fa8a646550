"""Adapters from records to the plain (ts, value) series the detectors read.

Per-step records give amounts per step; scrapes give gauges and cumulative counters, turned
into per-interval amounts here (a counter that went down was reset: its new value is the amount).
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.model import MetricsScrape, StepRecord

Point = tuple[float, float]

# Keys of MetricsScrape.values, as vLLM names the families (with or without "vllm:").
RUNNING = ("num_requests_running",)
WAITING = ("num_requests_waiting",)
KV_USAGE = ("kv_cache_usage_perc",)
PREEMPTIONS = ("num_preemptions_total", "num_preemptions")
GENERATION = ("generation_tokens_total", "generation_tokens")
PROMPT = ("prompt_tokens_total", "prompt_tokens")
ITL_SUM = ("inter_token_latency_seconds_sum",)
ITL_COUNT = ("inter_token_latency_seconds_count",)


def scrape_value(scrape: MetricsScrape, names: Sequence[str]) -> float | None:
    for name in names:
        for key in (name, "vllm:" + name):
            value = scrape.values.get(key)
            if value is not None:
                return float(value)
    return None


def gauge(scrapes: Sequence[MetricsScrape], names: Sequence[str]) -> list[Point]:
    out = []
    for s in scrapes:
        value = scrape_value(s, names)
        if value is not None:
            out.append((s.ts, value))
    return out


def counter(scrapes: Sequence[MetricsScrape], names: Sequence[str]) -> list[Point]:
    return gauge(scrapes, names)


def deltas(cumulative: Sequence[Point]) -> list[Point]:
    """Per-interval amounts of a cumulative counter, stamped at the end of each interval."""
    out = []
    for (_, v0), (t1, v1) in zip(cumulative, cumulative[1:], strict=False):
        out.append((t1, v1 - v0 if v1 >= v0 else v1))
    return out


def token_amounts(scrapes: Sequence[MetricsScrape]) -> list[Point]:
    gen = counter(scrapes, GENERATION)
    prompt = dict(counter(scrapes, PROMPT))
    combined = [(t, v + prompt.get(t, 0.0)) for t, v in gen]
    return deltas(combined)


def step_tokens(steps: Sequence[StepRecord]) -> list[Point]:
    """Tokens per step; a step that carries neither figure has no point (unknown is not 0)."""
    out: list[Point] = []
    for s in steps:
        if s.generation_tokens is None and s.prompt_tokens is None:
            continue
        out.append((s.ts, float((s.generation_tokens or 0) + (s.prompt_tokens or 0))))
    return out


def step_generation(steps: Sequence[StepRecord]) -> list[Point]:
    return [(s.ts, float(s.generation_tokens)) for s in steps if s.generation_tokens is not None]


def sum_between(points: Sequence[Point], start: float, end: float) -> float:
    """Sum of amounts stamped in (start, end]."""
    return sum(v for t, v in points if start < t <= end)


def window(points: Sequence[Point], start: float) -> list[Point]:
    out = []
    for p in reversed(points):
        if p[0] < start:
            break
        out.append(p)
    out.reverse()
    return out


def value_at(points: Sequence[Point], ts: float) -> float | None:
    """The last value stamped at or before ts."""
    found = None
    for t, v in points:
        if t > ts:
            break
        found = v
    return found


def connector_level(steps: Sequence[StepRecord], stat: str) -> list[Point]:
    """A connector level per step (``<Connector>.<stat>`` in the step's connector stats; the
    recorder reduces a level's list to its last value)."""
    out: list[Point] = []
    for s in steps:
        for key, value in s.connector.items():
            if key.rsplit(".", 1)[-1] == stat and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append((s.ts, float(value)))
                break
    return out
