"""The hub: where every source's observations land.

``emit`` (synchronous, never blocking) files each observation into the in-memory rings, queues
it for the batching writer, and checks it against the triggers. A trigger schedules a snapshot
of each affected engine: frozen and committed at once (fault to durable snapshot in
milliseconds), then amended once after ``snapshot_settle_s`` with the evidence that arrives
late (the engine's own error line comes hundreds of ms after the Xid; the second TP worker's
traceback; vLLM's crash dump; the steps the recorder flushed last). One fault seen by several
sources is one snapshot per engine: later triggers within ``incident_window_s`` join it.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from collector.model import (
    Event,
    EventKind,
    Fingerprint,
    GpuSample,
    LogLine,
    MetricsScrape,
    Observation,
    Severity,
    StepRecord,
)
from collector.ingest.pidmap import PidMap
from collector.ingest.request_columns import StepColumns
from collector.ingest.rings import EngineRing, LineRing, TimeRing
from collector.settings import Settings
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.freeze import build_snapshot, is_trigger
from collector.xid.merge import XidMerger

log = logging.getLogger(__name__)

MAX_PENDING = 200_000  # rows held for the writer while the database is down, per kind


class SnapshotSink(Protocol):
    def snapshot_due(self, engine: str, trigger: Event) -> None: ...


@dataclass
class EngineState:
    name: str
    url: str | None = None
    pair: str | None = None
    gpus: list[int] | None = None
    ring: EngineRing = field(default_factory=lambda: EngineRing(4096))
    lines: LineRing = field(default_factory=lambda: LineRing(2000))
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=500))
    scrapes: deque[MetricsScrape] = field(default_factory=lambda: deque(maxlen=900))
    fingerprint: dict[str, Any] = field(default_factory=dict)
    up: bool | None = None
    ever_up: bool = False
    last_seen: float | None = None
    steps_received: int = 0
    last_columns: StepColumns | None = None
    learned_gpus: set[int] = field(default_factory=set)  # from NVML's process lists


@dataclass
class PendingWrites:
    steps: dict[tuple[str, int], StepRecord] = field(default_factory=dict)
    gpu: list[GpuSample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    dropped: int = 0


class Hub:
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time,
                 proc_root: Path = Path("/proc")) -> None:
        self.settings = settings
        self.clock = clock
        self.host = settings.host_name or socket.gethostname()
        self.engines: dict[str, EngineState] = {}
        self.gpus: dict[str, TimeRing] = {}
        self.gpu_meta: dict[str, GpuSample] = {}
        self.host_events: deque[Event] = deque(maxlen=500)  # GPU-level events (Xid, lost)
        self.pending = PendingWrites()
        self.xid = XidMerger(window_s=2.0, clock=clock)
        self.snapshot_sink: SnapshotSink | None = None
        self.event_listeners: list[Callable[[Event, bool], None]] = []
        self.xid_counts: dict[tuple[str, int], int] = {}
        self.pids = PidMap(proc_root)
        for eng in settings.engines:
            self.engine(eng.name, url=eng.url, pair=eng.pair, gpus=eng.gpus)

    # -- engines -----------------------------------------------------------------------------
    def engine(self, name: str, **attrs: Any) -> EngineState:
        st = self.engines.get(name)
        if st is None:
            st = EngineState(
                name=name,
                ring=EngineRing(self.settings.ring_steps),
                lines=LineRing(self.settings.log_ring_lines),
            )
            self.engines[name] = st
        for k, v in attrs.items():
            if v is not None:
                setattr(st, k, v)
        return st

    # -- the sink ----------------------------------------------------------------------------
    def emit(self, item: Observation) -> None:
        try:
            if isinstance(item, StepRecord):
                self._step(item)
            elif isinstance(item, GpuSample):
                self._gpu(item)
            elif isinstance(item, Event):
                self._event(item)
            elif isinstance(item, MetricsScrape):
                self._scrape(item)
            elif isinstance(item, LogLine):
                self.engine(item.engine).lines.add(item)
            elif isinstance(item, Fingerprint):
                st = self.engine(item.engine)
                st.fingerprint = dict(item.facts)
                self.pending.fingerprints[item.engine] = st.fingerprint
        except Exception:  # a bad record must never stop the sources feeding us
            log.exception("hub dropped a %s", type(item).__name__)

    def _step(self, rec: StepRecord) -> None:
        # Records come from other processes: a wrong type must not poison the ring's order.
        rec.step, rec.ts = int(rec.step), float(rec.ts)
        st = self.engine(rec.engine)
        if rec.requests is not None:
            rec.request_columns = st.last_columns = StepColumns(rec.step, rec.requests, st.last_columns)
        held = st.ring.add(rec)
        st.steps_received += 1
        st.last_seen = rec.ts
        st.up = st.ever_up = True
        self.pending.steps[(rec.engine, held.step)] = held
        self.pending.seen[rec.engine] = rec.ts
        if len(self.pending.steps) > MAX_PENDING:
            self.pending.steps.pop(next(iter(self.pending.steps)))
            self.pending.dropped += 1

    def _gpu(self, s: GpuSample) -> None:
        ring = self.gpus.get(s.gpu)
        if ring is None:
            ring = self.gpus[s.gpu] = TimeRing(self.settings.gpu_ring_seconds)
        ring.add(s)
        self.gpu_meta[s.gpu] = s
        self.pending.gpu.append(s)
        if len(self.pending.gpu) > MAX_PENDING:
            del self.pending.gpu[: len(self.pending.gpu) - MAX_PENDING]
            self.pending.dropped += 1
        known = self._engine_pids()
        for proc in s.processes:
            name = self.pids.engine_of(proc.get("pid") if isinstance(proc, dict) else None, known)
            if name is not None:
                self.engines[name].learned_gpus.add(s.index)

    def _scrape(self, s: MetricsScrape) -> None:
        st = self.engine(s.engine)
        st.scrapes.append(s)
        if getattr(s, "origin", "scrape") == "scrape":  # a replayed log line proves nothing live
            st.up = st.ever_up = True

    def _event(self, ev: Event) -> None:
        is_new = True
        if ev.kind in (EventKind.XID, EventKind.GPU_LOST):
            ev, is_new = self.xid.offer(ev)
            if is_new and ev.xid is not None:
                key = (ev.gpu or "unknown", ev.xid)
                self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
        if ev.kind is EventKind.ENGINE_DOWN and ev.engine:
            self.engine(ev.engine).up = False
        if is_new:
            self.pending.events.append(ev)
        targets = self._engines_for(ev)
        if is_new:
            if ev.engine is None:
                self.host_events.append(ev)
            for name in targets:
                self.engine(name).events.append(ev)
        if is_new and is_trigger(ev) and self.snapshot_sink is not None:
            if ev.kind is EventKind.ENGINE_DOWN:
                # An engine never seen up has no last steps to freeze: the event (and its
                # alert) says it is down; a snapshot would be empty.
                targets = [n for n in targets if self.engines[n].ever_up]
            for name in targets:
                self.snapshot_sink.snapshot_due(name, ev)
        # Listeners (the alerter) run after the snapshot is scheduled, so they can hold an
        # alert until the snapshot it links to is committed.
        for listener in self.event_listeners:
            try:
                listener(ev, is_new)
            except Exception:
                log.exception("event listener failed")

    def _engines_for(self, ev: Event) -> list[str]:
        if ev.engine is not None:
            self.engine(ev.engine)
            return [ev.engine]
        if ev.kind not in (EventKind.XID, EventKind.GPU_LOST):
            return []
        # A GPU fault belongs to the engine whose worker it names (pid= in the kernel's line,
        # walked up the process tree), else to the engines on that GPU (configured, or learnt
        # from NVML's process lists), else to every engine on this host (better a snapshot
        # too many than none).
        owner = self.pids.engine_of(ev.pid, self._engine_pids())
        if owner is not None:
            return [owner]
        index = self._gpu_index(ev.gpu)
        mapped = [n for n, st in self.engines.items() if index in self._gpus_of(st)]
        if mapped:
            return mapped
        return [n for n, st in self.engines.items() if not self._gpus_of(st) or index is None]

    @staticmethod
    def _gpus_of(st: EngineState) -> set[int]:
        return set(st.gpus) if st.gpus is not None else st.learned_gpus

    def _engine_pids(self) -> dict[int, str]:
        """Known engine processes: the recorder's fingerprint carries the API server's pid."""
        out = {}
        for name, st in self.engines.items():
            pid = st.fingerprint.get("pid")
            if isinstance(pid, int) and pid > 1:
                out[pid] = name
        return out

    def _gpu_index(self, gpu: str | None) -> int | None:
        if gpu is None:
            return None
        for s in self.gpu_meta.values():
            if gpu in (s.gpu, s.bus_id):
                return s.index
        return None

    # -- snapshots ---------------------------------------------------------------------------
    def freeze(self, engine: str, trigger: Event) -> SnapshotDoc:
        st = self.engine(engine)
        steps = st.ring.steps()
        since = trigger.ts - self.settings.snapshot_gpu_seconds
        samples: list[GpuSample] = []
        for gpu, ring in self.gpus.items():
            meta = self.gpu_meta.get(gpu)
            gpus = self._gpus_of(st)
            if not gpus or (meta is not None and meta.index in gpus):
                samples.extend(ring.since(since))
        samples.sort(key=lambda s: s.ts)
        horizon = (steps[0].ts if steps else trigger.ts) - 60.0
        events = [e for e in st.events if e.ts >= horizon]
        events += [e for e in self.host_events if e.ts >= horizon and e not in events]
        events.sort(key=lambda e: e.ts)
        extra: dict[str, Any] = {}
        if st.scrapes:
            extra["last_scrape"] = {"ts": st.scrapes[-1].ts, "values": st.scrapes[-1].values}
        if st.pair:
            extra["pair"] = st.pair
        return build_snapshot(
            host=self.host, engine=engine, trigger=trigger, steps=steps, gpu_samples=samples,
            events=events, log_lines=st.lines.all(), fingerprint=st.fingerprint, extra_summary=extra,
        )  # fmt: skip

    def manual_trigger(self, engine: str | None, reason: str) -> list[str]:
        names = [engine] if engine else list(self.engines)
        ev = Event(kind=EventKind.MANUAL, ts=self.clock(), source="api", message=reason or "manual snapshot",
                   severity=Severity.INFO)  # fmt: skip
        self.pending.events.append(ev)
        if self.snapshot_sink is not None:
            for name in names:
                self.snapshot_sink.snapshot_due(name, ev)
        return names

    def take_pending(self) -> PendingWrites:
        out, self.pending = self.pending, PendingWrites()
        return out

    def requeue(self, batch: PendingWrites) -> None:
        """Put a batch the database refused back in front, within the bound."""
        cur = self.pending
        merged = PendingWrites(
            steps={**batch.steps, **cur.steps},
            gpu=(batch.gpu + cur.gpu)[-MAX_PENDING:],
            events=(batch.events + cur.events)[-MAX_PENDING:],
            fingerprints={**batch.fingerprints, **cur.fingerprints},
            seen={**batch.seen, **cur.seen},
            dropped=batch.dropped + cur.dropped,
        )
        while len(merged.steps) > MAX_PENDING:
            merged.steps.pop(next(iter(merged.steps)))
            merged.dropped += 1
        self.pending = merged
