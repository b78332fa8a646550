"""The windows: what the node held in memory over the last minutes, per engine and per GPU (the
recorder's memory-mapped rings are ``collector.channel``'s).

Per engine: its steps (``StepWindow``), log lines, events, scrapes and workload log; per GPU:
its samples and its last one; and the GPU-level events no engine claimed. Bounded by the
limits ingest is configured with; each engine's request blocks by its share of the node's
budget. Only ingest files into it (``collector.ingest.intake``, ``collector.ingest.routing``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from collector.ingest.config import IngestConfig
from collector.ingest.runs import PreviousRun, window_for
from collector.ingest.window import StepWindow
from collector.ingest.windows import LineWindow, TimeWindow
from collector.ingest.workload import WorkloadLog
from collector.model import Event, GpuSample, MetricsScrape, StepRequests

EVENTS_KEPT = 500
SCRAPES_KEPT = 900


@dataclass
class EngineWindows:
    window: StepWindow
    lines: LineWindow
    workload: WorkloadLog
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    scrapes: deque[MetricsScrape] = field(default_factory=lambda: deque(maxlen=SCRAPES_KEPT))
    last_block: StepRequests | None = None
    run: int | None = None  # the run ``window`` holds (``collector.ingest.runs``); None: no step yet
    previous: PreviousRun | None = None  # the run before, set aside whole


class WindowStore:
    def __init__(self, config: IngestConfig, *, scrape_seconds: float | None = None) -> None:
        self.config = config
        # scrapes are kept this long per engine (and at most 900): what their readers need (the
        # snapshot's five minutes, the engine detectors' longest window: 361 s by default),
        # told by whoever wires them. A scrape held is ~2 kB (its keys are shared:
        # collector.sources.vllm_metrics); 631 s of them at 8 engines, when the GPUs' ten-minute
        # ECC window set how long, was ~10 MB.
        self.scrape_seconds = scrape_seconds
        self.engines: dict[str, EngineWindows] = {}
        self.gpus: dict[str, TimeWindow] = {}
        self.gpu_last: dict[str, GpuSample] = {}
        self.host_events: deque[Event] = deque(maxlen=EVENTS_KEPT)  # GPU-level events (Xid, lost)

    def of(self, engine: str) -> EngineWindows:
        rings = self.engines.get(engine)
        if rings is None:
            cfg = self.config
            rings = self.engines[engine] = EngineWindows(
                window=StepWindow(engine, cfg.ring_steps, max_request_bytes=self._request_bytes(len(self.engines) + 1)),
                lines=LineWindow(cfg.log_ring_lines),
                workload=WorkloadLog(max_requests=cfg.workload_requests, max_age_s=cfg.workload_seconds),
            )
            share = rings.window.max_request_bytes
            for other in self.engines.values():
                if other.window.max_request_bytes > share:
                    other.window.set_max_request_bytes(share)
        return rings

    def forget(self, engine: str) -> None:
        """Drop an engine's rings (``collector.ingest.departures``); the others' shares of the
        node's request-block budget grow back to it."""
        if self.engines.pop(engine, None) is None:
            return
        share = self._request_bytes(len(self.engines))
        for other in self.engines.values():
            if other.window.max_request_bytes < share:
                other.window.max_request_bytes = share

    def window_of_run(self, engine: str, rings: EngineWindows, run: int, now: float) -> StepWindow | None:
        """The window that holds steps of ``run`` (``collector.ingest.runs``); None: not held. A
        newer run sets the current window aside as the previous run and starts a fresh one."""
        where = window_for(rings.run, rings.previous, run)
        if where == "current":
            rings.run = run
            return rings.window
        if where == "none":
            return None
        if where == "new":
            assert rings.run is not None
            rings.previous = PreviousRun(rings.run, rings.window, now)
            rings.window, rings.run, rings.last_block = self.fresh_window(engine), run, None
            return rings.window
        if rings.previous is None or rings.previous.run != run:  # an ended run read late
            rings.previous = PreviousRun(run, self.fresh_window(engine), now)
        return rings.previous.window

    def fresh_window(self, engine: str) -> StepWindow:
        return StepWindow(engine, self.config.ring_steps, max_request_bytes=self._request_bytes(len(self.engines)))

    def _request_bytes(self, engines: int) -> int:
        """Each engine's bound on its request blocks: its own setting, or its share of the
        node's (``ring_request_bytes_total``) when that is smaller."""
        return min(self.config.ring_request_bytes, self.config.ring_request_bytes_total // max(engines, 1))

    def add_scrape(self, s: MetricsScrape) -> None:
        scrapes = self.of(s.engine).scrapes
        scrapes.append(s)
        if self.scrape_seconds is not None:
            horizon = s.ts - self.scrape_seconds
            while scrapes[0].ts < horizon:
                scrapes.popleft()

    def add_gpu(self, s: GpuSample) -> None:
        ring = self.gpus.get(s.gpu)
        if ring is None:
            ring = self.gpus[s.gpu] = TimeWindow(self.config.gpu_ring_seconds)
        ring.add(s)
        self.gpu_last[s.gpu] = s

    def add_event(self, ev: Event, engines: tuple[str, ...]) -> None:
        if ev.engine is None:
            self.host_events.append(ev)
        for name in engines:
            self.of(name).events.append(ev)

    def replace_event(self, ev: Event) -> None:
        """Hold ``ev`` where the event with its id is held (a later witness merged into it)."""
        for events in (self.host_events, *(r.events for r in self.engines.values())):
            for i, held in enumerate(events):
                if held.uid == ev.uid:
                    events[i] = ev

    def gpu_index(self, gpu: str | None) -> int | None:
        """The index of the GPU an event names (its NVML id or PCI bus id), when sampled."""
        if gpu is None:
            return None
        for s in self.gpu_last.values():
            if gpu in (s.gpu, s.bus_id):
                return s.index
        return None

    def gpu_samples(self, *, since: float, gpus: set[int] | None = None) -> list[GpuSample]:
        out: list[GpuSample] = []
        for gpu, ring in list(self.gpus.items()):
            meta = self.gpu_last.get(gpu)
            if not gpus or (meta is not None and meta.index in gpus):
                out.extend(ring.since(since))
        out.sort(key=lambda s: s.ts)
        return out
