"""Ingest: where every source's observations land.

``emit`` (synchronous, never blocking, on the event loop) files each observation into the
in-memory rings, hands rows to the writer's queue, gives events their id, merges the kernel's
and NVML's report of one Xid, routes GPU faults to engines, and passes every event downstream
(``on_event``: the trigger policy, then the alert router). Data flows one way: sources -> this
-> consumers given at construction; nothing downstream is called back into, and what the API
and the snapshot freeze read goes through the read-only queries at the bottom.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from collector.channel.blocks import RequestBlock
from collector.ingest.fingerprints import merge_fingerprint
from collector.ingest.pidmap import PidMap
from collector.ingest.rings import EngineRing, LineRing, TimeRing
from collector.ingest.workload import WorkloadLog
from collector.model import (
    HALF_REQUESTS,
    Event,
    EventKind,
    Fingerprint,
    GpuSample,
    LogLine,
    MetricsScrape,
    Observation,
    StepRecord,
    WorkloadRecord,
)
from collector.settings import Settings
from collector.xid.merge import XidMerger

log = logging.getLogger(__name__)


class RowSink(Protocol):
    """The writer's queue (``collector.storage.writer.BatchWriter``)."""

    def offer_step(self, rec: StepRecord) -> None: ...
    def offer_gpu(self, s: GpuSample) -> None: ...
    def offer_scrape(self, s: MetricsScrape) -> None: ...
    def offer_event(self, ev: Event) -> None: ...
    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None: ...


class _NoRows:
    def offer_step(self, rec: StepRecord) -> None: ...
    def offer_gpu(self, s: GpuSample) -> None: ...
    def offer_scrape(self, s: MetricsScrape) -> None: ...
    def offer_event(self, ev: Event) -> None: ...
    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None: ...


EventConsumer = Callable[[Event, bool], None]  # (event, is_new)


@dataclass
class EngineState:
    """One engine as ingest knows it. Owned by the hub; read by others through queries."""

    name: str
    url: str | None = None
    pair: str | None = None
    gpus: list[int] | None = None
    configured: bool = False
    ring: EngineRing = field(default_factory=lambda: EngineRing(4096))
    lines: LineRing = field(default_factory=lambda: LineRing(2000))
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=500))
    scrapes: deque[MetricsScrape] = field(default_factory=lambda: deque(maxlen=900))
    workload: WorkloadLog = field(default_factory=WorkloadLog)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    up: bool | None = None  # the one place engine up/down is kept
    ever_up: bool = False
    last_seen: float | None = None  # newest record from the recorder
    last_scrape_ok: float | None = None
    steps_received: int = 0
    requests_received: int = 0  # request rows, counted per block (no per-row work)
    last_block: RequestBlock | None = None
    learned_gpus: set[int] = field(default_factory=set)  # from NVML's process lists


class Hub:
    def __init__(
        self,
        settings: Settings,
        *,
        rows: RowSink | None = None,
        consumers: Sequence[EventConsumer] = (),
        clock: Callable[[], float] = time.time,
        proc_root: Path = Path("/proc"),
        scrape_seconds: float | None = None,
    ) -> None:
        self.settings = settings
        # scrapes are kept this long per engine (and at most 900): what their readers need (the
        # snapshot's five minutes, the detectors' longest window), told by whoever wires them.
        # At 8 engines each scrape held is ~3.5 kB: 15 minutes of them was 25 MB.
        self.scrape_seconds = scrape_seconds
        self.clock = clock
        self.host = settings.host_name or socket.gethostname()
        self.rows: RowSink = rows or _NoRows()
        self.consumers = list(consumers)
        self.engines: dict[str, EngineState] = {}
        self.gpus: dict[str, TimeRing] = {}
        self.gpu_meta: dict[str, GpuSample] = {}
        self.host_events: deque[Event] = deque(maxlen=500)  # GPU-level events (Xid, lost)
        self.xid = XidMerger(window_s=2.0, clock=clock)
        self.xid_counts: dict[tuple[str, int], int] = {}
        self.pids = PidMap(proc_root)
        self.dropped = 0  # observations that raised while being filed (counted, logged once each kind)
        self._drop_logged: set[str] = set()
        for eng in settings.engines:
            self.engine(eng.name, url=eng.url, pair=eng.pair, gpus=eng.gpus, configured=True)

    # -- engines -----------------------------------------------------------------------------
    def engine(self, name: str, **attrs: Any) -> EngineState:
        st = self.engines.get(name)
        if st is None:
            st = EngineState(
                name=name,
                ring=EngineRing(self.settings.ring_steps, max_request_bytes=self._request_bytes(len(self.engines) + 1)),
                lines=LineRing(self.settings.log_ring_lines),
                workload=WorkloadLog(max_requests=self.settings.workload_requests, max_age_s=self.settings.workload_seconds),
            )
            self.engines[name] = st
            share = st.ring.max_request_bytes
            for other in self.engines.values():
                if other.ring.max_request_bytes > share:
                    other.ring.set_max_request_bytes(share)
        for k, v in attrs.items():
            if v is not None:
                setattr(st, k, v)
        return st

    def _request_bytes(self, engines: int) -> int:
        """Each engine's bound on its request blocks: its own setting, or its share of the
        node's (``ring_request_bytes_total``) when that is smaller."""
        return min(self.settings.ring_request_bytes, self.settings.ring_request_bytes_total // max(engines, 1))

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
                st.fingerprint = merge_fingerprint(st.fingerprint, item.facts)
                self.rows.offer_fingerprint(item.engine, st.fingerprint)
            elif isinstance(item, WorkloadRecord):
                self.engine(item.engine).workload.add(item)
        except Exception:  # a bad record must never stop the sources feeding us
            self.dropped += 1
            kind = type(item).__name__
            if kind not in self._drop_logged:
                self._drop_logged.add(kind)
                log.exception("ingest set aside a %s (further ones are counted, not logged)", kind)

    def _step(self, rec: StepRecord) -> None:
        # Records come from other processes: a wrong type must not poison the ring's order.
        if type(rec.step) is not int or not 0 <= rec.step < 1 << 62 or not isinstance(rec.ts, float):
            rec.step, rec.ts = int(rec.step), float(rec.ts)
            if not 0 <= rec.step < 1 << 62:
                raise ValueError(f"step {rec.step} out of range")
        st = self.engine(rec.engine)
        if rec.finished_requests:
            # vLLM's per-request finish figures ride on every step that ended a request: a dict
            # of 8 fields each, 35 MiB of a node's rings (8 x 4,096 steps) that nothing reads
            # (the snapshot's steps carry the ``finished`` count; each request's end is in the
            # workload log, from its own record). Not held.
            rec.finished_requests = []
        if rec.requests is not None and rec.request_block is None:
            rec.request_block = RequestBlock.from_rows(rec.step, rec.ts, rec.requests, st.last_block)
            rec.requests = None
            rec.halves |= HALF_REQUESTS
            if rec.running is None:
                rec.running = rec.request_block.running
        block = rec.request_block
        if block is not None:
            last = st.last_block
            if last is not None and last.ids == block.ids:
                block.ids = last.ids  # one copy of a stable running set's ids
            st.last_block = block
            st.requests_received += block.n
        held = st.ring.add(rec)
        st.steps_received += 1
        st.last_seen = rec.ts
        st.up = st.ever_up = True
        self.rows.offer_step(held)

    def _gpu(self, s: GpuSample) -> None:
        ring = self.gpus.get(s.gpu)
        if ring is None:
            ring = self.gpus[s.gpu] = TimeRing(self.settings.gpu_ring_seconds)
        ring.add(s)
        self.gpu_meta[s.gpu] = s
        self.rows.offer_gpu(s)
        known = self._engine_pids()
        for proc in s.processes:
            name = self.pids.engine_of(proc.get("pid") if isinstance(proc, dict) else None, known)
            if name is not None:
                self.engines[name].learned_gpus.add(s.index)

    def _scrape(self, s: MetricsScrape) -> None:
        st = self.engine(s.engine)
        scrapes = st.scrapes
        scrapes.append(s)
        if self.scrape_seconds is not None:
            horizon = s.ts - self.scrape_seconds
            while scrapes[0].ts < horizon:
                scrapes.popleft()
        if s.origin == "scrape":  # a replayed log line proves nothing live
            st.up = st.ever_up = True
            st.last_scrape_ok = s.ts
            self.rows.offer_scrape(s)

    def _event(self, ev: Event) -> None:
        if not ev.uid:
            ev.uid = uuid.uuid4().hex
        is_new = True
        if ev.kind in (EventKind.XID, EventKind.GPU_LOST):
            ev, is_new = self.xid.offer(ev)
            if is_new and ev.xid is not None:
                key = (ev.gpu or "unknown", ev.xid)
                self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
        if ev.kind is EventKind.ENGINE_DOWN and ev.engine:
            self.engine(ev.engine).up = False
        if is_new:
            self.rows.offer_event(ev)
        targets = self.engines_for(ev)
        if is_new:
            if ev.engine is None:
                self.host_events.append(ev)
            for name in targets:
                self.engine(name).events.append(ev)
        for consumer in self.consumers:
            try:
                consumer(ev, is_new)
            except Exception:
                log.exception("event consumer failed")

    def engines_for(self, ev: Event) -> list[str]:
        """The engines an event belongs to."""
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
        mapped = [n for n, st in self.engines.items() if index in self.gpus_of(st)]
        if mapped:
            return mapped
        return [n for n, st in self.engines.items() if not self.gpus_of(st) or index is None]

    @staticmethod
    def gpus_of(st: EngineState) -> set[int]:
        return set(st.gpus) if st.gpus is not None else st.learned_gpus

    def _engine_pids(self) -> dict[int, str]:
        """Known engine processes: the recorder's fingerprint carries the API server's pid."""
        out = {}
        for name, st in self.engines.items():
            for key in ("server_pid", "pid"):
                pid = st.fingerprint.get(key)
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

    # -- read-only queries (the freeze, the API, the detectors) -------------------------------
    def engine_names(self) -> list[str]:
        return list(self.engines)

    def steps(self, engine: str) -> list[StepRecord]:
        st = self.engines.get(engine)
        return st.ring.steps() if st is not None else []

    def recent_steps(self, engine: str, n: int) -> list[StepRecord]:
        st = self.engines.get(engine)
        return st.ring.recent(n) if st is not None else []

    def gpu_samples(self, *, since: float, gpus: set[int] | None = None) -> list[GpuSample]:
        out: list[GpuSample] = []
        for gpu, ring in list(self.gpus.items()):
            meta = self.gpu_meta.get(gpu)
            if not gpus or (meta is not None and meta.index in gpus):
                out.extend(ring.since(since))
        out.sort(key=lambda s: s.ts)
        return out
