"""Filing: each observation that is data (steps, GPU samples, scrapes, log lines, fingerprints,
workload records) goes into the engine registry and the rings and to the writer's queue; each
event is queued for routing (``collector.ingest.routing``). Synchronous, never blocking, on the
event loop. Records are immutable once filed: what needs normalising (a record from another
process with a wrong type) becomes a new record first.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from collector.columns import StepBatch
from collector.ingest.config import IngestConfig
from collector.ingest.engines import EngineRegistry
from collector.ingest.store import RingStore
from collector.model import (
    HALF_REQUESTS,
    HALF_STATS,
    Event,
    Fingerprint,
    GpuSample,
    LogLine,
    MetricsScrape,
    Observation,
    StepRecord,
    WorkloadBatch,
)
from collector.xid.merge import XidMerger

log = logging.getLogger(__name__)


class RowSink(Protocol):
    """The writer's queue (``collector.storage.writer.BatchWriter``)."""

    def offer_step(self, rec: StepRecord) -> None: ...
    # one engine's merged, final steps as columns (collector.columns)
    def offer_steps(self, batch: StepBatch) -> None: ...
    def offer_gpu(self, s: GpuSample) -> None: ...
    def offer_scrape(self, s: MetricsScrape) -> None: ...
    def offer_event(self, ev: Event) -> None: ...
    # ``ev`` replaces the event offered with its id, if not written yet (a later witness merged
    # into it; once written, the snapshot's link updates its row)
    def amend_event(self, ev: Event) -> None: ...
    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None: ...


class _NoRows:
    def offer_step(self, rec: StepRecord) -> None: ...
    def offer_steps(self, batch: StepBatch) -> None: ...
    def offer_gpu(self, s: GpuSample) -> None: ...
    def offer_scrape(self, s: MetricsScrape) -> None: ...
    def offer_event(self, ev: Event) -> None: ...
    def amend_event(self, ev: Event) -> None: ...
    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None: ...


class Intake:
    def __init__(
        self,
        config: IngestConfig,
        *,
        rows: RowSink | None = None,
        clock: Callable[[], float] = time.time,
        proc_root: Path = Path("/proc"),
        scrape_seconds: float | None = None,
    ) -> None:
        self.clock = clock
        self.host = config.host_name or socket.gethostname()
        self.rows: RowSink = rows or _NoRows()
        self.engines = EngineRegistry(proc_root=proc_root)
        self.store = RingStore(config, scrape_seconds=scrape_seconds)
        self.xid = XidMerger(window_s=2.0, clock=clock)
        # GPU id (UUID, or an index as a string) -> who holds it, as the kubelet's PodResources
        # API says (discovery hands it in): a GPU fault's event names them
        self.gpu_holders: dict[str, tuple[dict[str, Any], ...]] = {}
        self.xid_counts: dict[tuple[str, int], int] = {}
        self.events: deque[Event] = deque()  # filed, waiting for the router
        self.dropped = 0  # observations that raised while being filed (counted, logged once each kind)
        self._drop_logged: set[str] = set()
        for eng in config.engines:
            self.engine(eng.name, url=eng.url, pair=eng.pair, gpus=eng.gpus, configured=True)

    def engine(
        self,
        name: str,
        *,
        url: str | None = None,
        pair: str | None = None,
        gpus: list[int] | None = None,
        configured: bool = False,
        up: bool | None = None,
        pod_uid: str | None = None,
    ) -> None:
        """The engine is known, with its rings, and the facts given are kept (also what engine
        discovery learns of a pod before its first record: its URL, pair, GPUs, or that it is
        gone, ``up=False``; its pod's UID, by which a GPU fault's pid finds it)."""
        self.engines.ensure(name, url=url, pair=pair, gpus=gpus, configured=configured, pod_uid=pod_uid)
        self.store.of(name)
        if up is False:
            self.engines.departed(name, self.clock())

    def departed_before(self, ts: float) -> list[str]:
        """Engines discovery said left at ``ts`` or before (``collector.ingest.departures``)."""
        return self.engines.departed_before(ts)

    def forget(self, name: str) -> None:
        """Free what ingest holds for a departed engine: its registry record and rings. Its
        events held for snapshots go with them; stored ones stay."""
        self.engines.forget(name)
        self.store.forget(name)

    def set_gpu_holders(self, holders: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """Who holds each GPU (namespace, pod, container, device), replacing the last map."""
        self.gpu_holders = {str(gpu): tuple(dict(h) for h in hs) for gpu, hs in holders.items()}

    def holders_of(self, gpu: str | None) -> list[dict[str, Any]]:
        """Who holds the GPU an event names (its UUID, bus id or index), as last told."""
        if gpu is None or not self.gpu_holders:
            return []
        if gpu in self.gpu_holders:
            return [dict(h) for h in self.gpu_holders[gpu]]
        for s in self.store.gpu_last.values():
            if gpu in (s.gpu, s.bus_id):
                for key in (s.gpu, str(s.index)):
                    if key in self.gpu_holders:
                        return [dict(h) for h in self.gpu_holders[key]]
        return []

    def file(self, item: Observation) -> None:
        try:
            if isinstance(item, StepRecord):
                self._step(item)
            elif isinstance(item, GpuSample):
                self.store.add_gpu(item)
                self.rows.offer_gpu(item)
                self.engines.learn_gpus(item.index, item.processes)
            elif isinstance(item, Event):
                self.events.append(item)
            elif isinstance(item, MetricsScrape):
                self._scrape(item)
            elif isinstance(item, LogLine):
                self.engine(item.engine)
                self.store.of(item.engine).lines.add(item)
            elif isinstance(item, Fingerprint):
                self.engine(item.engine)
                self.engines.set_fingerprint(item.engine, item.facts)
                self.rows.offer_fingerprint(item.engine, self.engines.fingerprint(item.engine))
            elif isinstance(item, WorkloadBatch):
                self.engine(item.engine)
                self.store.of(item.engine).workload.add(item)
        except Exception:  # a bad record must never stop the sources feeding us
            self.set_aside(item)

    def file_many(self, items: Sequence[Observation]) -> None:
        """``file`` for each, in order; a run of one engine's steps (a recorder poll reads an
        engine's rings one after another) is filed together: the engine's registry record and
        rings looked up once, its counters moved once (``_steps``)."""
        i, end = 0, len(items)
        while i < end:
            item = items[i]
            if type(item) is not StepRecord:
                self.file(item)
                i += 1
                continue
            engine = item.engine
            j = i + 1
            while j < end and type(nxt := items[j]) is StepRecord and nxt.engine == engine:
                j += 1
            self._steps(engine, cast("Sequence[StepRecord]", items[i:j]))
            i = j

    def emit(self, item: Observation) -> None:
        """Filing as a source's sink (the trigger policy reads the recorder this way before a
        capture): data is filed at once, an event waits for the router's next turn."""
        self.file(item)

    def emit_many(self, items: Sequence[Observation]) -> None:
        """``emit`` for a source's poll in one call (``file_many``)."""
        self.file_many(items)

    def set_aside(self, item: Observation) -> None:
        self.dropped += 1
        kind = type(item).__name__
        if kind not in self._drop_logged:
            self._drop_logged.add(kind)
            log.exception("ingest set aside a %s (further ones are counted, not logged)", kind)

    def _step(self, rec: StepRecord) -> None:
        self._steps(rec.engine, (rec,))

    def _steps(self, engine: str, recs: Sequence[StepRecord]) -> None:
        """One engine's steps, in order. A step that raises is set aside alone."""
        try:
            self.engine(engine)
            rings = self.store.of(engine)
        except Exception:
            for rec in recs:
                self.set_aside(rec)
            return
        offer = self.rows.offer_step
        halves = rows = 0
        last_ts: float | None = None
        last_step = 0
        for rec in recs:
            try:
                # another run of the engine than the ring's: collector.ingest.runs
                ring = rings.ring if rec.run == rings.run else self.store.ring_of_run(rings, rec.run, self.clock())
                if ring is None:  # a run older than the two held: stored, not held
                    offer(rec)
                    continue
                # Records come from other processes: a wrong type must not poison the ring's order.
                if type(rec.step) is not int or not 0 <= rec.step < 1 << 62 or type(rec.ts) is not float:
                    rec = dataclasses.replace(rec, step=int(rec.step), ts=float(rec.ts))
                    if not 0 <= rec.step < 1 << 62:
                        raise ValueError(f"step {rec.step} out of range")
                if rec.finished_requests:
                    # vLLM's per-request finish figures ride on every step that ended a request:
                    # a dict of 8 fields each, 35 MiB of a node's rings (8 x 4,096 steps) that
                    # nothing reads (the snapshot's steps carry the ``finished`` count; each
                    # request's end is in the workload log, from its own record). Not held.
                    rec = dataclasses.replace(rec, finished_requests=[])
                block = rec.request_block
                if block is not None:
                    last = rings.last_block
                    if last is not None and last.ids == block.ids:
                        block.ids = last.ids  # one copy of a stable running set's ids (the same values)
                    rings.last_block = block
                offer(ring.add(rec))
            except Exception:  # a bad record must never stop the sources feeding us
                self.set_aside(rec)
                continue
            if block is not None:
                rows += block.n
            # a step's two halves may come as one record (paired by the recorder source): each counts
            halves += 2 if rec.halves == HALF_STATS | HALF_REQUESTS else 1
            last_ts, last_step = rec.ts, rec.step
        if last_ts is not None:
            # the engine's progress: the newest step, and running + waiting of the newest step
            # that carries them (its stats half; usually the last or the one before)
            held = held_ts = None
            for rec in reversed(recs):
                if rec.running is not None and rec.waiting is not None:
                    held, held_ts = rec.running + rec.waiting, rec.ts
                    break
            self.engines.saw_step(engine, last_ts, rows, halves, step=last_step, held=held, held_ts=held_ts)

    def _scrape(self, s: MetricsScrape) -> None:
        self.engine(s.engine)
        self.store.add_scrape(s)
        if s.origin == "scrape":  # a replayed log line proves nothing live
            self.engines.saw_scrape(s.engine, s.ts, s.values, s.paused)
            self.rows.offer_scrape(s)
