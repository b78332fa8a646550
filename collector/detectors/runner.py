"""Runs every detector over the live series once a call, and reports published state changes.

The hub calls ``evaluate`` about once a second with what its rings hold; the runner keeps a
``Hysteresis`` per (detector, labels) and returns only ``Transition``s, which the hub turns
into ``fire``/``resolve`` calls. Per-step records are preferred where an engine has them;
scrapes cover the rest (and an engine that stopped stepping).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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
from collector.model import GpuSample, MetricsScrape, Severity, StepRecord

T = TypeVar("T")
Key = tuple[str, tuple[tuple[str, str], ...]]


def _group(items: Mapping[str, Sequence[T]] | Iterable[T], key: Callable[[T], str]) -> dict[str, list[T]]:
    if isinstance(items, Mapping):
        return {k: list(v) for k, v in items.items()}
    out: dict[str, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """One engine's series over the detectors' history, brought up to date once a tick for all
    of them (``series.StepPoints``: the steps' series; ``series.ScrapeSeries``: the scrapes')."""

    waiting: list[S.Point]
    tokens: list[S.Point]
    kv: list[S.Point]
    preempt: list[S.Point]
    demand: list[S.Point]
    # the host-side figures of every step (they ride on either half): HiSparse's host blocks,
    # running requests, and the connector's pending page transfers and host cache usage levels
    blocks: list[S.Point]
    running: list[S.Point]
    pending: list[S.Point]
    usage: list[S.Point]
    scrapes: S.ScrapeSeries
    sc_waiting: list[S.Point]
    sc_tokens: list[S.Point]
    sc_demand: list[S.Point]
    from_steps: bool  # the step figures come from the recorder (else from the scrapes)
    last_scrape: float | None


@dataclass(frozen=True, slots=True)
class GpuSeries:
    samples: list[GpuSample]
    published: Callable[[str], Severity]  # a detector's published level for this GPU


Labels = dict[str, str]


def _stall(x: EngineSeries, thr: Any, now: float, labels: Labels) -> DetectorState:
    # a hung engine stops stepping but its /metrics still answers: the stall check merges both
    waiting = sorted(x.waiting + x.sc_waiting) if x.from_steps else x.waiting
    tokens = sorted(x.tokens + x.sc_tokens) if x.from_steps else x.tokens
    return detect_stall(waiting, tokens, now=now, labels=labels, thr=thr)


def _host_backlog(x: EngineSeries, thr: Any, now: float, labels: Labels) -> DetectorState | None:
    if not (x.blocks or x.pending or x.usage):
        return None  # no HiSparse here
    return detect_host_backlog(x.blocks, x.running, x.pending, x.usage, now=now, labels=labels, thr=thr)


def _throughput(x: EngineSeries, thr: Any, now: float, labels: Labels) -> DetectorState:
    # scrapes reach further back than a step ring at hundreds of steps a second
    tokens = x.sc_tokens if len(x.scrapes.times) >= 2 else x.tokens
    demand = x.sc_demand if len(x.scrapes.times) >= 2 else x.demand
    return detect_throughput_collapse(tokens, demand, now=now, labels=labels, thr=thr)


def _latency(x: EngineSeries, thr: Any, now: float, labels: Labels) -> DetectorState | None:
    if not x.scrapes.times:
        return None  # inter-token latency comes from /metrics only
    return detect_itl_regression(list(x.scrapes.itl_sum), list(x.scrapes.itl_count), now=now, labels=labels, thr=thr)


# Every detector in one table: the ``DetectorThresholds`` field that holds its thresholds (and
# ``enabled``), and how it reads the series. A detector that returns None has nothing to judge.
ENGINE_DETECTORS: tuple[tuple[str, Callable[[EngineSeries, Any, float, Labels], DetectorState | None]], ...] = (
    ("stall", _stall),
    ("kv_jump", lambda x, thr, now, labels: detect_kv_jump(x.kv, now=now, labels=labels, thr=thr)),
    ("preemption", lambda x, thr, now, labels: detect_preemption_storm(x.preempt, now=now, labels=labels, thr=thr)),
    ("host_backlog", _host_backlog),
    ("throughput", _throughput),
    ("latency", _latency),
    ("scrape_gone", lambda x, thr, now, labels: detect_scrape_gone(x.last_scrape, now=now, labels=labels, thr=thr)),
)
GPU_DETECTORS: tuple[tuple[str, Callable[[GpuSeries, Any, float, Labels], DetectorState | None]], ...] = (
    (
        "throttling",
        lambda x, thr, now, labels: detect_throttling(
            x.samples[-1] if x.samples else None, previous=x.published(THROTTLING), now=now, labels=labels, thr=thr
        ),
    ),
    ("ecc", lambda x, thr, now, labels: detect_memory_errors(x.samples, now=now, labels=labels, thr=thr)),
)


class DetectorRunner:
    def __init__(self, thresholds: DetectorThresholds | None = None, clock: Callable[[], float] = time.time) -> None:
        self.thr = thresholds or DetectorThresholds()
        self._clock = clock
        self._hysteresis: dict[Key, Hysteresis] = {}
        self._published: dict[Key, DetectorState] = {}
        self._last_scrape: dict[str, float] = {}
        self._last_raw: dict[Key, dict[Severity, DetectorState]] = {}
        self._scrape_series: dict[str, S.ScrapeSeries] = {}
        self._step_points: dict[str, S.StepPoints] = {}

    def states(self) -> list[DetectorState]:
        """The published state of every (detector, labels) seen, for the API."""
        return list(self._published.values())

    def forget(self, engine: str) -> None:
        """Drop a departed engine's series and states (``collector.ingest.departures``)."""
        self._last_scrape.pop(engine, None)
        self._scrape_series.pop(engine, None)
        self._step_points.pop(engine, None)
        label = ("engine", engine)
        for table in (self._hysteresis, self._published, self._last_raw):
            for key in [k for k in table if label in k[1]]:
                del table[key]

    def history_s(self) -> float:
        """How far back the detectors read any series (the longest window and baseline)."""
        return max(self.engine_history_s(), self.thr.ecc.window_s + 1.0)

    def engine_history_s(self) -> float:
        """How far back the engine detectors read an engine's steps and scrapes (the GPU's ECC
        window, ten minutes, is not theirs: it reads GPU samples only)."""
        t = self.thr
        return (
            max(
                t.stall.critical_after_s * 2,
                t.kv_jump.window_s,
                t.preemption.window_s,
                t.host_backlog.window_s,
                t.throughput.window_s + t.throughput.baseline_s,
                t.latency.window_s + t.latency.baseline_s,
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
        start = now - self.engine_history_s()
        raw: list[DetectorState] = []
        by_engine = _group(scrapes, lambda s: s.engine)
        for engine, items in by_engine.items():
            if items:
                self._last_scrape[engine] = max(self._last_scrape.get(engine, 0.0), items[-1].ts)
        engines = set(engine_steps) | set(by_engine) | set(self._last_scrape)
        for gone in self._step_points.keys() - engines:  # (not judged this tick: its steps not held)
            del self._step_points[gone]
        for engine in sorted(engines):
            points = self._step_points.get(engine)
            if points is None:
                points = self._step_points[engine] = S.StepPoints()
            points.update(since(engine_steps.get(engine, ()), start, lambda s: s.ts))
            series = self._scrape_series.get(engine)
            if series is None:
                series = self._scrape_series[engine] = S.ScrapeSeries()
            series.feed(by_engine.get(engine, ()))
            series.trim(start)
            raw += self._engine_states(engine, points, series, now)
        gpu_start = now - self.history_s()
        for gpu, samples in _group(gpu_samples, lambda s: s.gpu).items():
            raw += self._gpu_states(gpu, since(samples, gpu_start, lambda s: s.ts), now)
        return self._publish(raw)

    def _engine_states(self, engine: str, points: S.StepPoints, scrapes: S.ScrapeSeries, now: float) -> list[DetectorState]:
        # Steps when the recorder runs; scrapes otherwise. Only steps whose stats half arrived
        # carry the figures (the others' are unknown, not 0), and each series takes the steps
        # that carry its figures: one unread field costs that series its points, not every
        # detector the step. The detectors get copies: the series are kept for the next tick.
        # the scrape series, kept up to date one scrape at a time (several detectors read them)
        sc_waiting = list(scrapes.waiting)
        sc_tokens = list(scrapes.tokens)
        sc_demand = list(scrapes.demand)
        waiting, tokens, kv, preempt, demand, blocks, running, pending, usage = map(list, points.series)
        from_steps = points.from_steps
        if not from_steps:
            waiting, tokens, kv = sc_waiting, sc_tokens, list(scrapes.kv)
            preempt, demand = S.deltas(list(scrapes.preempt)), sc_demand
        series = EngineSeries(
            waiting=waiting,
            tokens=tokens,
            kv=kv,
            preempt=preempt,
            demand=demand,
            blocks=blocks,
            running=running,
            pending=pending,
            usage=usage,
            scrapes=scrapes,
            sc_waiting=sc_waiting,
            sc_tokens=sc_tokens,
            sc_demand=sc_demand,
            from_steps=from_steps,
            last_scrape=self._last_scrape.get(engine),
        )
        return self._run(ENGINE_DETECTORS, series, now, {"engine": engine})

    def _gpu_states(self, gpu: str, samples: list[GpuSample], now: float) -> list[DetectorState]:
        def published(name: str) -> Severity:
            state = self._published.get((name, (("gpu", gpu),)))
            return state.state if state else Severity.OK

        return self._run(GPU_DETECTORS, GpuSeries(samples, published), now, {"gpu": gpu})

    def _run(
        self, table: Sequence[tuple[str, Callable[[Any, Any, float, Labels], DetectorState | None]]], series: Any, now: float, labels: Labels
    ) -> list[DetectorState]:
        out = []
        for field_name, run in table:
            thr = getattr(self.thr, field_name)
            if thr.enabled and (state := run(series, thr, now, labels)) is not None:
                out.append(state)
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
