"""Runs every detector over the live series once a call, and reports published state changes.

The hub calls ``evaluate`` about once a second with what its rings hold; the runner keeps a
``Hysteresis`` per (detector, labels) and returns only ``Transition``s, which the hub turns
into ``fire``/``resolve`` calls. Per-step records are preferred where an engine has them;
scrapes cover the rest (and an engine that stopped stepping).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from collector.detectors import series as S
from collector.detectors.base import DetectorState, Hysteresis, Transition, since
from collector.detectors.config import DetectorThresholds
from collector.detectors.ecc import detect_memory_errors
from collector.detectors.host_backlog import detect_host_backlog
from collector.detectors.kv_jump import detect_kv_jump
from collector.detectors.latency import detect_itl_regression
from collector.detectors.preemption import detect_preemption_storm
from collector.detectors.scrape_gone import detect_scrape_gone
from collector.detectors.stall import detect_stall
from collector.detectors.throttling import NAME as THROTTLING
from collector.detectors.throttling import detect_throttling
from collector.detectors.throughput import detect_throughput_collapse
from collector.model import HALF_STATS, GpuSample, MetricsScrape, Severity, StepRecord

T = TypeVar("T")
Key = tuple[str, tuple[tuple[str, str], ...]]


def _group(items: Mapping[str, Sequence[T]] | Iterable[T], key: Callable[[T], str]) -> dict[str, list[T]]:
    if isinstance(items, Mapping):
        return {k: list(v) for k, v in items.items()}
    out: dict[str, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def _step_series(steps: Sequence[StepRecord]) -> tuple[list[S.Point], list[S.Point], list[S.Point], list[S.Point], list[S.Point]]:
    """waiting, tokens, kv usage, preemptions and demand (running + waiting) of the steps that
    carry each figure, in one walk of the steps (an unread figure costs its series the point)."""
    waiting: list[S.Point] = []
    tokens: list[S.Point] = []
    kv: list[S.Point] = []
    preempt: list[S.Point] = []
    demand: list[S.Point] = []
    for s in steps:
        ts, w, r, g, p = s.ts, s.waiting, s.running, s.generation_tokens, s.prompt_tokens
        if w is not None:
            waiting.append((ts, float(w)))
            if r is not None:
                demand.append((ts, float(r + w)))
        if g is not None or p is not None:
            tokens.append((ts, float((g or 0) + (p or 0))))
        if s.kv_cache_usage is not None:
            kv.append((ts, s.kv_cache_usage))
        if s.preemptions is not None:
            preempt.append((ts, float(s.preemptions)))
    return waiting, tokens, kv, preempt, demand


class DetectorRunner:
    def __init__(self, thresholds: DetectorThresholds | None = None, clock: Callable[[], float] = time.time) -> None:
        self.thr = thresholds or DetectorThresholds()
        self._clock = clock
        self._hysteresis: dict[Key, Hysteresis] = {}
        self._published: dict[Key, DetectorState] = {}
        self._last_scrape: dict[str, float] = {}
        self._last_raw: dict[Key, dict[Severity, DetectorState]] = {}
        self._scrape_series: dict[str, S.ScrapeSeries] = {}

    def states(self) -> list[DetectorState]:
        """The published state of every (detector, labels) seen, for the API."""
        return list(self._published.values())

    def history_s(self) -> float:
        """How far back the detectors read the series (the longest window and baseline)."""
        t = self.thr
        return (
            max(
                t.stall.critical_after_s * 2,
                t.kv_jump.window_s,
                t.preemption.window_s,
                t.host_backlog.window_s,
                t.throughput.window_s + t.throughput.baseline_s,
                t.latency.window_s + t.latency.baseline_s,
                t.ecc.window_s,
            )
            + 1.0
        )

    def evaluate(
        self,
        engine_steps: Mapping[str, Sequence[StepRecord]],
        gpu_samples: Mapping[str, Sequence[GpuSample]] | Iterable[GpuSample] = (),
        scrapes: Mapping[str, Sequence[MetricsScrape]] | Iterable[MetricsScrape] = (),
        *,
        now: float | None = None,
    ) -> list[Transition]:
        now = self._clock() if now is None else now
        start = now - self.history_s()
        raw: list[DetectorState] = []
        by_engine = _group(scrapes, lambda s: s.engine)
        for engine, items in by_engine.items():
            if items:
                self._last_scrape[engine] = max(self._last_scrape.get(engine, 0.0), items[-1].ts)
        engines = set(engine_steps) | set(by_engine) | set(self._last_scrape)
        for engine in sorted(engines):
            steps = since(engine_steps.get(engine, ()), start, lambda s: s.ts)
            series = self._scrape_series.get(engine)
            if series is None:
                series = self._scrape_series[engine] = S.ScrapeSeries()
            series.feed(by_engine.get(engine, ()))
            series.trim(start)
            raw += self._engine_states(engine, steps, series, now)
        for gpu, samples in _group(gpu_samples, lambda s: s.gpu).items():
            raw += self._gpu_states(gpu, since(samples, start, lambda s: s.ts), now)
        return self._publish(raw)

    def _engine_states(self, engine: str, steps: list[StepRecord], scrapes: S.ScrapeSeries, now: float) -> list[DetectorState]:
        t = self.thr
        labels = {"engine": engine}
        out = []
        # Steps when the recorder runs; scrapes otherwise. A hung engine stops stepping but its
        # /metrics still answers, so the stall check merges both. Only steps whose stats half
        # arrived carry the figures (the others' are unknown, not 0).
        # Each series takes the steps that carry its figures: one unread field costs that series
        # its points, not every detector the step.
        all_steps = steps
        steps = [s for s in steps if s.halves & HALF_STATS]
        # the scrape series, kept up to date one scrape at a time (several detectors read them)
        sc_waiting = list(scrapes.waiting)
        sc_tokens = list(scrapes.tokens)
        sc_demand = [(ts, r + w) for (ts, r), (_, w) in zip(scrapes.running, sc_waiting, strict=False)]
        if steps:
            waiting, tokens, kv, preempt, demand = _step_series(steps)
        else:
            waiting = sc_waiting
            tokens = sc_tokens
            kv = list(scrapes.kv)
            preempt = S.deltas(list(scrapes.preempt))
            demand = sc_demand
        if t.stall.enabled:
            stall_waiting = sorted(waiting + sc_waiting) if steps else waiting
            stall_tokens = sorted(tokens + sc_tokens) if steps else tokens
            out.append(detect_stall(stall_waiting, stall_tokens, now=now, labels=labels, thr=t.stall))
        if t.kv_jump.enabled:
            out.append(detect_kv_jump(kv, now=now, labels=labels, thr=t.kv_jump))
        if t.preemption.enabled:
            out.append(detect_preemption_storm(preempt, now=now, labels=labels, thr=t.preemption))
        if t.host_backlog.enabled and all_steps:
            blocks = [(s.ts, float(b)) for s in all_steps if (b := s.host_blocks) is not None]
            pending = S.connector_level(all_steps, "pending_page_transfers")
            usage = S.connector_level(all_steps, "host_cache_usage_perc")
            if blocks or pending or usage:
                running = [(s.ts, float(s.running)) for s in all_steps if s.running is not None]
                out.append(detect_host_backlog(blocks, running, pending, usage, now=now, labels=labels, thr=t.host_backlog))
        if t.throughput.enabled:
            # scrapes reach further back than a step ring at hundreds of steps a second
            long_tokens = sc_tokens if len(scrapes.times) >= 2 else tokens
            long_demand = sc_demand if len(scrapes.times) >= 2 else demand
            out.append(detect_throughput_collapse(long_tokens, long_demand, now=now, labels=labels, thr=t.throughput))
        if t.latency.enabled and scrapes.times:
            out.append(
                detect_itl_regression(
                    list(scrapes.itl_sum),
                    list(scrapes.itl_count),
                    now=now,
                    labels=labels,
                    thr=t.latency,
                )
            )
        if t.scrape_gone.enabled:
            out.append(detect_scrape_gone(self._last_scrape.get(engine), now=now, labels=labels, thr=t.scrape_gone))
        return out

    def _gpu_states(self, gpu: str, samples: list[GpuSample], now: float) -> list[DetectorState]:
        t = self.thr
        labels = {"gpu": gpu}
        out = []
        if t.throttling.enabled:
            published = self._published.get((THROTTLING, (("gpu", gpu),)))
            previous = published.state if published else Severity.OK
            out.append(detect_throttling(samples[-1] if samples else None, previous=previous, now=now, labels=labels, thr=t.throttling))
        if t.ecc.enabled:
            out.append(detect_memory_errors(samples, now=now, labels=labels, thr=t.ecc))
        return out

    def _publish(self, raw: list[DetectorState]) -> list[Transition]:
        transitions = []
        for state in raw:
            key = state.key
            gate = self._hysteresis.get(key)
            if gate is None:
                gate = self._hysteresis[key] = Hysteresis(enter_after=self.thr.enter_after, exit_after=self.thr.exit_after)
            level = gate.update(state.state)
            seen = self._last_raw.setdefault(key, {})
            seen[state.state] = state
            previous = self._published.get(key) or DetectorState(state.name, Severity.OK, labels=state.labels, ts=state.ts)
            if level is state.state:
                current = state
            elif level is previous.state:
                current = previous  # held: keep what was published (its reason) until it moves
            else:
                # moved to a level the raw state is not at now (the mildest of a streak):
                # say why with the last raw state that was at that level
                current = seen.get(level) or DetectorState(
                    state.name, level, state.reason, state.suggested_action, state.value, state.labels, state.ts
                )
            self._published[key] = current
            if current.state is not previous.state:
                transitions.append(Transition(previous=previous, current=current))
        return transitions
