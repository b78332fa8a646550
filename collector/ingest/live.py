"""The view over ingest's live state (``collector.ingest.view.IngestView``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collector.ingest.intake import Intake
from collector.ingest.progress import Progress
from collector.ingest.routing import route
from collector.ingest.state import EngineState
from collector.ingest.view import EngineInfo, Route, RunInfo
from collector.model import Event, GpuSample, LogLine, MetricsScrape, StepRecord


class LiveView:
    def __init__(self, intake: Intake) -> None:
        self._in = intake
        self._engines = intake.engines
        self._store = intake.store

    @property
    def host(self) -> str:
        return self._in.host

    @property
    def dropped(self) -> int:
        return self._in.dropped

    def now(self) -> float:
        return self._in.clock()

    def engine_names(self) -> list[str]:
        return self._engines.names()

    def engine(self, name: str) -> EngineInfo | None:
        return self._engines.info(name)

    def route(self, ev: Event) -> Route:
        return route(ev, self._engines, self._store)

    def progress(self, name: str) -> Progress | None:
        return self._engines.progress(name)

    def accepted_since(self, name: str, ts: float) -> tuple[int, float | None]:
        """Requests its API server accepted after ``ts`` and not ended (its workload records),
        and the first one's arrival; (0, None) without them."""
        rings = self._store.engines.get(name)
        return rings.workload.open_since(ts) if rings is not None else (0, None)

    def engine_state(self, name: str) -> EngineState | None:
        return self._engines.state(name, self._in.clock())

    def steps(self, engine: str) -> Sequence[StepRecord]:
        rings = self._store.engines.get(engine)
        return rings.window.held() if rings is not None else []

    def run_info(self, engine: str) -> RunInfo:
        """The run the engine's ring holds, and the previous one (``collector.ingest.runs``)."""
        rings = self._store.engines.get(engine)
        if rings is None:
            return RunInfo(run=None)
        prev = rings.previous
        if prev is None:
            return RunInfo(run=rings.run)
        first = prev.window.steps()[:1]
        last = prev.window.last()
        return RunInfo(
            run=rings.run,
            previous=prev.run,
            previous_ended=prev.ended,
            previous_steps=len(prev.window),
            previous_first_step=first[0].step if first else None,
            previous_last_step=last.step if last is not None else None,
        )

    def previous_steps(self, engine: str) -> Sequence[StepRecord]:
        """The previous run's steps, held apart from the current run's (oldest first)."""
        rings = self._store.engines.get(engine)
        return rings.previous.window.held() if rings is not None and rings.previous is not None else []

    def recent_steps(self, engine: str, n: int) -> list[StepRecord]:
        rings = self._store.engines.get(engine)
        return rings.window.recent(n) if rings is not None else []

    def step_seconds(self, engine: str) -> list[StepRecord]:
        """The engine's steps folded per second (``window.SecondAggregates``), oldest first."""
        rings = self._store.engines.get(engine)
        return rings.window.seconds.all() if rings is not None else []

    def last_step(self, engine: str) -> StepRecord | None:
        rings = self._store.engines.get(engine)
        return rings.window.last() if rings is not None else None

    def last_known(self, engine: str, name: str) -> StepRecord | None:
        rings = self._store.engines.get(engine)
        return rings.window.last_known(name) if rings is not None else None

    def has_step(self, engine: str, step: int) -> bool:
        rings = self._store.engines.get(engine)
        return rings is not None and rings.window.get(step) is not None

    def steps_held(self, engine: str) -> int:
        rings = self._store.engines.get(engine)
        return len(rings.window) if rings is not None else 0

    def scrapes(self, engine: str, *, since: float | None = None) -> list[MetricsScrape]:
        rings = self._store.engines.get(engine)
        if rings is None:
            return []
        return list(rings.scrapes) if since is None else [s for s in rings.scrapes if s.ts >= since]

    def last_scrape(self, engine: str) -> MetricsScrape | None:
        rings = self._store.engines.get(engine)
        return rings.scrapes[-1] if rings is not None and rings.scrapes else None

    def log_lines(self, engine: str) -> list[LogLine]:
        rings = self._store.engines.get(engine)
        return rings.lines.all() if rings is not None else []

    def events(self, engine: str, *, since: float) -> list[Event]:
        """The engine's events and the GPU-level ones no engine claimed, oldest first."""
        rings = self._store.engines.get(engine)
        out = [e for e in rings.events if e.ts >= since] if rings is not None else []
        seen = {e.uid for e in out}
        out += [e for e in self._store.host_events if e.ts >= since and e.uid not in seen]
        out.sort(key=lambda e: e.ts)
        return out

    def workload(self, engine: str, ts: float, *, crashed: bool) -> Any:
        rings = self._store.engines.get(engine)
        if rings is None or not len(rings.workload):
            return None
        return rings.workload.export(ts, crashed=crashed)

    def gpus(self) -> dict[str, GpuSample]:
        return dict(self._store.gpu_last)

    def gpu_series(self) -> dict[str, list[GpuSample]]:
        return {gpu: ring.since(0.0) for gpu, ring in list(self._store.gpus.items())}

    def gpu_samples(self, *, since: float, gpus: set[int] | None = None) -> list[GpuSample]:
        return self._store.gpu_samples(since=since, gpus=gpus)

    def gpu_key(self, gpu: str) -> str:
        """One name per GPU, however an event names it (NVML's id or the PCI bus id): its index
        when sampled, else the name given."""
        index = self._store.gpu_index(gpu)
        return f"index:{index}" if index is not None else gpu

    def xid_counts(self) -> dict[tuple[str, int], int]:
        return dict(self._in.xid_counts)
