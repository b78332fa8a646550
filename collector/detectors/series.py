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

from collector.model import HALF_STATS, MetricsScrape, StepRecord

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
        self.demand: deque[Point] = deque()  # running + waiting, of the scrapes that have both
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
            waiting, running = scrape_value(s, WAITING), scrape_value(s, RUNNING)
            if waiting is not None:
                self.waiting.append((ts, waiting))
            if running is not None:
                self.running.append((ts, running))
                if waiting is not None:
                    self.demand.append((ts, running + waiting))
            for series, names in (
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
        for series in (self.waiting, self.running, self.demand, self.kv, self.preempt, self.tokens, self.itl_sum, self.itl_count):
            while series and series[0][0] < start:
                series.popleft()


# The series ``StepPoints`` reads off an engine's steps, in the order a record's points are made.
STEP_SERIES = ("waiting", "tokens", "kv", "preempt", "demand", "blocks", "running", "pending", "usage")
_PENDING, _USAGE = "pending_page_transfers", "host_cache_usage_perc"


def _connector_value(connector: dict[str, object], stat: str) -> float | None:
    suffix = "." + stat
    for key, value in connector.items():
        if (key == stat or key.endswith(suffix)) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _step_points(s: StepRecord, out: tuple[list[Point], ...]) -> None:
    """Append one step's points to ``out`` (``STEP_SERIES``' lists). The first five come from
    the stat logger's half only (the others' figures are unknown, not 0): waiting, tokens
    (prompt + generation), KV usage, preemptions, demand (running + waiting). Then host blocks,
    running and HiSparse's two connector levels, from either half."""
    ts = s.ts
    if s.halves & HALF_STATS:
        w, r, g, p = s.waiting, s.running, s.generation_tokens, s.prompt_tokens
        if w is not None:
            out[0].append((ts, float(w)))
            if r is not None:
                out[4].append((ts, float(r + w)))
        if g is not None or p is not None:
            out[1].append((ts, float((g or 0) + (p or 0))))
        if s.kv_cache_usage is not None:
            out[2].append((ts, s.kv_cache_usage))
        if s.preemptions is not None:
            out[3].append((ts, float(s.preemptions)))
    if (b := s.host_blocks) is not None:
        out[5].append((ts, float(b)))
    if s.running is not None:
        out[6].append((ts, float(s.running)))
    if s.connector:
        for i, stat in ((7, _PENDING), (8, _USAGE)):
            if (v := _connector_value(s.connector, stat)) is not None:
                out[i].append((ts, v))


class StepPoints:
    """One engine's series read off its steps (``STEP_SERIES``), kept from one detector tick to
    the next: each tick reads only the steps that are not the ones read before.

    ``update`` takes the steps in the detectors' window, oldest first: the engine's per-second
    records (``collector.ingest.window.SecondAggregates``), the same objects from tick to tick
    but the last few (the open second's is new at each read, and a late half of a step rebuilds
    its second's record). It finds the previous tick's steps that are still these, by identity
    and in order from the oldest still in the window, keeps their points, and reads the rest. A
    list that shares none (a test's fresh records) is read afresh: the series are those of
    reading every step each tick (a hypothesis test holds it to that)."""

    def __init__(self) -> None:
        self._steps: list[StepRecord] = []
        self._made: list[tuple[int, ...]] = []  # how many points each step gave each series
        self.series: tuple[list[Point], ...] = tuple([] for _ in STEP_SERIES)

    @property
    def from_steps(self) -> bool:
        """Whether a step in the window has the stat logger's half (its figures)."""
        return any(s.halves & HALF_STATS for s in self._steps)

    def update(self, steps: Sequence[StepRecord]) -> None:
        steps = list(steps)
        kept = self._keep(steps)
        out, made = self.series, self._made
        self._steps = []  # (a step that fails to read leaves nothing to resume from: read afresh next tick)
        for s in islice(steps, kept, None):
            before = list(map(len, out))
            _step_points(s, out)
            made.append(tuple(len(pts) - n for pts, n in zip(out, before, strict=True)))
        self._steps = steps

    def _keep(self, steps: list[StepRecord]) -> int:
        """How many of ``steps`` (from the first) were read before, the series cut to them."""
        prev, made = self._steps, self._made
        first = steps[0] if steps else None
        gone = next((i for i, s in enumerate(prev) if s is first), len(prev))  # left the window
        kept = next(
            (i for i, (a, b) in enumerate(zip(islice(prev, gone, None), steps, strict=False)) if a is not b), min(len(prev) - gone, len(steps))
        )
        if not kept:
            self.series = tuple([] for _ in STEP_SERIES)
            self._made = []
            return 0
        # the points of the steps read before but no longer these records, then of those that left the window
        self._cut(made[gone + kept :], from_end=True)
        del made[gone + kept :]
        self._cut(made[:gone], from_end=False)
        del made[:gone]
        return kept

    def _cut(self, made: list[tuple[int, ...]], *, from_end: bool) -> None:
        """Drop the points of the steps whose counts are ``made``, at the series' end or start."""
        if not made:
            return
        for pts, n in zip(self.series, map(sum, zip(*made, strict=True)), strict=True):
            if n:
                del pts[slice(len(pts) - n, None) if from_end else slice(n)]
