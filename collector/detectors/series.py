"""Adapters from records to the plain (ts, value) series the detectors read.

Per-step records give amounts per step; scrapes give gauges and cumulative counters, turned
into per-interval amounts here (a counter that went down was reset: its new value is the amount).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import accumulate, islice
from operator import itemgetter

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


_TS = itemgetter(0)


def sum_between(points: Sequence[Point], start: float, end: float) -> float:
    """Sum of amounts stamped in (start, end]."""
    return sum(v for t, v in points if start < t <= end)


class Sums:
    """Sums of a series' amounts over many spans (``between``), each by two bisections of its
    times and a difference of running totals: the throughput detector's baseline reads a dozen
    windows of the same series every tick. The points must be in time order (every series the
    detectors read is). The amounts are token counts: their running totals are exact in a
    float."""

    def __init__(self, points: Sequence[Point]) -> None:
        self.times = [t for t, _ in points]
        self.totals = list(accumulate((v for _, v in points), initial=0.0))

    def between(self, start: float, end: float) -> float:
        """Sum of amounts stamped in (start, end]: ``sum_between``'s."""
        times = self.times
        return self.totals[bisect_right(times, end)] - self.totals[bisect_right(times, start)] if end > start else 0.0


def window(points: Sequence[Point], start: float) -> list[Point]:
    """The points stamped at ``start`` or later (the series are in time order: a bisection)."""
    if isinstance(points, list):
        return points[bisect_left(points, start, key=_TS) :]
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
    suffix = "." + stat  # (a key's last dotted part is ``stat``; ``stat`` holds no dot)
    for s in steps:
        for key, value in s.connector.items():
            if (key == stat or key.endswith(suffix)) and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append((s.ts, float(value)))
                break
    return out


class ScrapeSeries:
    """One engine's scrape series, kept up to date one scrape at a time: each tick extracts the
    scrapes that arrived since the last one instead of every scrape held (361 s of them per
    engine).

    ``feed`` takes the engine's scrapes oldest first (the hub's deque, the same objects from tick
    to tick): it finds the last scrape it took by identity and extracts what follows; a list
    that does not hold it (another engine's history, a test's fresh one) is read afresh."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.times: deque[float] = deque()  # every scrape's
        self.waiting: deque[Point] = deque()
        self.running: deque[Point] = deque()
        self.kv: deque[Point] = deque()
        self.preempt: deque[Point] = deque()  # cumulative
        self.tokens: deque[Point] = deque()  # per-interval generation + prompt (token_amounts)
        self.itl_sum: deque[Point] = deque()
        self.itl_count: deque[Point] = deque()
        self._last: MetricsScrape | None = None
        self._last_tokens: float | None = None

    def feed(self, scrapes: Sequence[MetricsScrape]) -> None:
        start = 0
        if self._last is not None:
            for i in range(len(scrapes) - 1, -1, -1):
                if scrapes[i] is self._last:
                    start = i + 1
                    break
            else:
                self._reset()
        for s in islice(scrapes, start, None):
            ts = s.ts
            self.times.append(ts)
            for series, names in (
                (self.waiting, WAITING),
                (self.running, RUNNING),
                (self.kv, KV_USAGE),
                (self.preempt, PREEMPTIONS),
                (self.itl_sum, ITL_SUM),
                (self.itl_count, ITL_COUNT),
            ):
                value = scrape_value(s, names)
                if value is not None:
                    series.append((ts, value))
            gen = scrape_value(s, GENERATION)
            if gen is not None:
                combined = gen + (scrape_value(s, PROMPT) or 0.0)
                prior = self._last_tokens
                if prior is not None:
                    self.tokens.append((ts, combined - prior if combined >= prior else combined))
                self._last_tokens = combined
        if scrapes:
            self._last = scrapes[-1]

    def trim(self, start: float) -> None:
        """Forget points stamped before ``start``."""
        while self.times and self.times[0] < start:
            self.times.popleft()
        for series in (self.waiting, self.running, self.kv, self.preempt, self.tokens, self.itl_sum, self.itl_count):
            while series and series[0][0] < start:
                series.popleft()
