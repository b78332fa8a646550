"""Filing: each observation that is data (steps, GPU samples, scrapes, log lines, fingerprints,
workload records) goes into the engine registry and the rings and to the writer's queue; each
event is queued for routing (``collector.ingest.routing``). Synchronous, never blocking, on the
event loop. Records are immutable once filed.

Steps come as a ring read's columns (``StepHalves``) or, from tests, tools and the simulator, as
``StepRecord``s (made columns here). Each engine run's window (``collector.ingest.window``)
holds them; once a step's hold has passed (the writer's ``hold_s``: both halves are in), it goes
to the writer as part of a ``StepBatch`` (``_release_steps``: at a filing once one is due, and
before each of the writer's flushes).
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from collector.columns import INT_NULL, STATS_DTYPE, StepBatch, stats_of_records
from collector.ingest.config import IngestConfig
from collector.ingest.engines import EngineRegistry
from collector.ingest.store import EngineWindows, WindowStore
from collector.ingest.window import StepWindow
from collector.model import (
    HALF_REQUESTS,
    HALF_STATS,
    Event,
    Fingerprint,
    GpuSample,
    LogLine,
    MetricsScrape,
    Observation,
    StepHalves,
    StepRecord,
    StepRequests,
    WorkloadBatch,
)
from collector.xid.merge import XidMerger

log = logging.getLogger(__name__)


class RowSink(Protocol):
    """The writer's queue (``collector.storage.writer.BatchWriter``)."""

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
        self.store = WindowStore(config, scrape_seconds=scrape_seconds)
        self.xid = XidMerger(window_s=2.0, clock=clock)
        # GPU id (UUID, or an index as a string) -> who holds it, as the kubelet's PodResources
        # API says (discovery hands it in): a GPU fault's event names them
        self.gpu_holders: dict[str, tuple[dict[str, Any], ...]] = {}
        self.xid_counts: dict[tuple[str, int], int] = {}
        self._events: deque[Event] = deque()  # filed, waiting for the router (``next_event``)
        self.dropped = 0  # observations that raised while being filed (counted, logged once each kind)
        self._drop_logged: set[str] = set()
        # a step's hold before it is stored (both halves in), on the writer's clock; the writer
        # asks for what is due before each flush
        self._hold_clock: Callable[[], float] = getattr(self.rows, "clock", time.monotonic)
        self._hold_s = float(getattr(self.rows, "hold_s", 0.0))
        self._due_at = float("inf")  # the earliest a held step is due (on the hold clock)
        # a writer that asks before each flush (``steps_from``); else the steps due are handed
        # over from filing, at most once a second
        attach = getattr(self.rows, "steps_from", None)
        self._asked = attach is not None
        if attach is not None:
            attach(self._release_steps, self._steps_held)
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
        events held for snapshots go with them; stored ones stay (its steps not stored yet are
        handed to the writer first)."""
        rings = self.store.engines.get(name)
        if rings is not None:
            self._release_engine(rings, 0.0, everything=True)
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

    def _file(self, item: Observation) -> None:
        try:
            if type(item) is StepHalves:
                self._halves(item)
            elif isinstance(item, StepRecord):
                self._records(item.engine, (item,))
            elif isinstance(item, GpuSample):
                self.store.add_gpu(item)
                self.rows.offer_gpu(item)
                self.engines.learn_gpus(item.index, item.processes)
            elif isinstance(item, Event):
                self._events.append(item)
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
        if not self._asked and self._hold_clock() >= self._due_at:
            self._release_steps()

    def _file_many(self, items: Sequence[Observation]) -> None:
        """``_file`` for each, in order; a run of one engine's step records is filed together."""
        i, end = 0, len(items)
        while i < end:
            item = items[i]
            if type(item) is not StepRecord:
                self._file(item)
                i += 1
                continue
            engine = item.engine
            j = i + 1
            while j < end and type(nxt := items[j]) is StepRecord and nxt.engine == engine:
                j += 1
            try:
                self._records(engine, cast("Sequence[StepRecord]", items[i:j]))
            except Exception:
                for rec in items[i:j]:
                    self.set_aside(rec)
            i = j
        if not self._asked and self._hold_clock() >= self._due_at:
            self._release_steps()

    # -- the front door: a source's sink (``collector.sources.base.Sink``) --------------------
    def emit(self, item: Observation) -> None:
        """File one observation: data at once; an event waits for the router (``next_event``).
        The hub (``collector.ingest.hub``) is this plus routing; the trigger policy's read
        before a capture files this way, its events routed at the router's next turn."""
        self._file(item)

    def emit_many(self, items: Sequence[Observation]) -> None:
        """``emit`` for a source's poll in one call: a run of one engine's steps filed together."""
        self._file_many(items)

    def next_event(self) -> Event | None:
        """The oldest event filed and not routed yet (the router's), or None."""
        return self._events.popleft() if self._events else None

    @property
    def events_waiting(self) -> int:
        return len(self._events)

    def set_aside(self, item: Observation) -> None:
        self.dropped += 1
        kind = type(item).__name__
        if kind not in self._drop_logged:
            self._drop_logged.add(kind)
            log.exception("ingest set aside a %s (further ones are counted, not logged)", kind)

    # -- steps ---------------------------------------------------------------------------------
    def _records(self, engine: str, recs: Sequence[StepRecord]) -> None:
        """Step records (the slow path: tests, tools, the simulator) as one engine's halves,
        a run at a time. A record that cannot be made a half is set aside alone."""
        i, end = 0, len(recs)
        while i < end:
            run = recs[i].run
            j = i
            stats: list[StepRecord] = []
            blocks: list[StepRequests] = []
            at: list[tuple[int, float]] = []
            while j < end and recs[j].run == run:
                rec = recs[j]
                j += 1
                try:
                    # records come from other processes: a wrong type must not poison the window
                    step = int(rec.step)
                    if not 0 <= step < 1 << 62 or float(rec.ts) != float(rec.ts):
                        raise ValueError(f"step {step} at {rec.ts} out of range")
                    halves = rec.halves or (HALF_STATS | (HALF_REQUESTS if rec.request_block is not None else 0))
                    if halves & HALF_STATS:
                        stats_of_records([rec])  # raises for a figure that is not a number
                        stats.append(rec)
                    if halves & HALF_REQUESTS and rec.request_block is not None:
                        blocks.append(rec.request_block)
                        at.append((step, float(rec.ts)))
                except Exception:
                    self.set_aside(rec)
            rows, extras = stats_of_records(stats) if stats else (None, {})
            self._halves(StepHalves(engine, run, rows, extras, tuple(blocks), tuple(at)))
            i = j

    def _halves(self, h: StepHalves) -> None:
        """One read's step halves of one engine run (``StepHalves``)."""
        engine, run = h.engine, h.run
        self.engine(engine)
        rings = self.store.of(engine)
        stamp = self._hold_clock()
        # another run of the engine than the window's: collector.ingest.runs
        window = rings.window if run == rings.run else self.store.window_of_run(engine, rings, run, self.clock())
        held = window is not None
        if window is None:  # a run older than the two held: stored, not held
            window = StepWindow(engine, max(1, h.count))
        blocks = h.blocks
        if blocks:
            last = rings.last_block if held else None
            for block in blocks:
                # one copy of a stable running set's ids (the same values); a block left in its
                # ring holds no copy to share
                if last is not None and getattr(block, "held", True) and getattr(last, "held", True) and last.ids == block.ids:
                    block.ids = last.ids
                last = block
            if held:
                rings.last_block = last
        stats = h.stats
        if stats is not None and len(stats):
            if stats.dtype != STATS_DTYPE:
                raise TypeError("stats halves of another dtype")
            window.file_stats(run, stats, h.extras, stamp)
        if blocks:
            window.file_blocks(run, blocks, stamp, h.block_at)
        if not held:
            batch = window.due(stamp, everything=True)
            if batch is not None:
                self.rows.offer_steps(batch)
        elif self._due_at == float("inf"):
            self._due_at = stamp + self._hold_s
        self._progress(engine, h)

    def _progress(self, engine: str, h: StepHalves) -> None:
        """The engine's counters and progress: the newest step, and running + waiting of the
        newest step that carries them (its stats half)."""
        stats, blocks = h.stats, h.blocks
        rows = sum(b.n for b in blocks)
        last_ts, last_step = -1.0, -1
        held = held_ts = None
        if stats is not None and len(stats):
            last_ts, last_step = float(stats["ts"][-1]), int(stats["step"][-1])
            both = np.flatnonzero((stats["running"] != INT_NULL) & (stats["waiting"] != INT_NULL))
            if len(both):
                k = int(both[-1])
                held, held_ts = int(stats["running"][k]) + int(stats["waiting"][k]), float(stats["ts"][k])
        if blocks:
            b_step, b_ts = h.block_at[-1] if h.block_at else (blocks[-1].step, blocks[-1].ts)
            if b_step >= last_step:
                last_ts, last_step = b_ts, b_step
        if last_step >= 0:
            self.engines.saw_step(engine, last_ts, rows, h.count, step=last_step, held=held, held_ts=held_ts)

    def _release_steps(self, everything: bool = False) -> None:
        """Hand the writer every step whose hold has passed (all with ``everything``: at stop)."""
        now = self._hold_clock()
        cutoff = now - self._hold_s
        self._due_at = float("inf")
        for rings in list(self.store.engines.values()):
            self._release_engine(rings, cutoff, everything=everything)
            for w in (rings.window, rings.previous.window if rings.previous is not None else None):
                if w is not None and w.next_stamp() is not None:
                    self._due_at = min(self._due_at, w.next_stamp() + self._hold_s)  # type: ignore[operator]
        self._due_at = max(self._due_at, now + 1.0)  # (filing hands over at most once a second)

    def _steps_held(self) -> int:
        """Steps filed and not handed to the writer yet."""
        n = 0
        for rings in list(self.store.engines.values()):
            n += rings.window.unsent()
            if rings.previous is not None:
                n += rings.previous.window.unsent()
        return n

    def _release_engine(self, rings: EngineWindows, cutoff: float, *, everything: bool) -> None:
        windows = [rings.window] if rings.previous is None else [rings.previous.window, rings.window]
        for w in windows:
            try:
                batch = w.due(cutoff, everything=everything)
                if batch is not None:
                    self.rows.offer_steps(batch)
            except Exception:  # never stop the others' steps
                log.exception("handing %s's steps to the writer failed", w.engine)

    def _scrape(self, s: MetricsScrape) -> None:
        self.engine(s.engine)
        self.store.add_scrape(s)
        if s.origin == "scrape":  # a replayed log line proves nothing live
            self.engines.saw_scrape(s.engine, s.ts, s.values, s.paused)
            self.rows.offer_scrape(s)
