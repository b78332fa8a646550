"""The batching writer: it owns the queue of rows for the continuous series, its bound and its
retries. Every ``interval`` it writes what is due in one transaction (SQLite: ~300k rows/s
batched vs ~10k one commit per row).

Steps come from ingest as column batches (``collector.columns.StepBatch``), each step final:
ingest holds a step ``hold_s`` (on this writer's ``clock``) after its first half came, so the
stored row has both halves and a step is one row (the table's unique key on engine, run and step
makes a re-read ring after a restart a no-op, not duplicates). Before each flush the writer asks
ingest for the steps now due (``steps_from``).

A database that is down or hung costs memory only: the batch stays queued (bounded: the oldest
rows are dropped and counted in ``dropped``) and is retried next round. A row the database
refuses for its content (``StorageError.permanent``) is set aside and counted, so one bad row
never blocks the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collector.columns import StepBatch
from collector.model import Event, GpuSample, MetricsScrape
from collector.redact import redact, redact_text
from collector.storage.connect import StorageError
from collector.storage.repo import STEP_TUPLE, Repository
from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)

MAX_PENDING = 200_000  # rows held per kind while the database is down
# A step's second half comes within this after its first: a ring is read every recorder_read_s
# (at most 1.5 s), plus a poll and a margin. Ingest holds a step this long before it is stored.
HOLD_S = 2.0


def gpu_row(s: GpuSample) -> dict[str, Any]:
    return {
        "gpu": s.gpu,
        "index": s.index,
        "bus_id": s.bus_id,
        "name": s.name,
        "ts": s.ts,
        "memory_used": s.memory_used,
        "memory_total": s.memory_total,
        "utilization": s.utilization,
        "temperature": s.temperature,
        "power_w": s.power_w,
        "sm_clock_mhz": s.sm_clock_mhz,
        "clock_event_reasons": s.clock_event_reasons,
        "ecc_volatile_uncorrected": s.ecc_volatile_uncorrected,
        "remapped_rows_uncorrectable": s.remapped_rows_uncorrectable,
        "pcie_replay": s.pcie_replay,
    }


def scrape_row(s: MetricsScrape) -> dict[str, Any]:
    v = s.values
    return {
        "engine": s.engine,
        "ts": s.ts,
        "running": v.get("num_requests_running"),
        "waiting": v.get("num_requests_waiting"),
        "kv_cache_usage": v.get("kv_cache_usage_perc"),
        "values": {**v, **{f"rate:{k}": r for k, r in s.rates.items()}},
    }


def event_row(ev: Event) -> dict[str, Any]:
    data = dict(ev.data)
    if ev.frames:
        data["frames"] = ev.frames
    if ev.lines:
        data["lines"] = ev.lines[-200:]
    data["sources"] = ev.sources
    return {
        "uid": ev.uid or None,
        "ts": ev.ts,
        "kind": ev.kind.value,
        "source": ev.source,
        "severity": ev.severity.value,
        "engine": ev.engine,
        "gpu": ev.gpu,
        "xid": ev.xid,
        "pid": ev.pid,
        "process": ev.process,
        "message": redact_text(ev.message)[:8000],
        "data": redact(data),
        "snapshot_id": None,  # linked by the snapshot commit (storage/events.py), never here
    }


def _replace_queued(events: list[Event], ev: Event) -> None:
    """``ev`` in place of the queued event with its id, if any (a merge is rare: a scan)."""
    for i, queued in enumerate(events):
        if queued.uid == ev.uid:
            events[i] = ev


@dataclass
class _Queue:
    batches: list[StepBatch] = field(default_factory=list)  # merged steps as columns: written as they are
    gpu: list[GpuSample] = field(default_factory=list)
    scrapes: list[MetricsScrape] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)


class BatchWriter:
    def __init__(
        self, repo: Repository, *, interval: float, hold_s: float = HOLD_S, clock: Any = time.monotonic, max_pending: int = MAX_PENDING
    ) -> None:
        self.repo = repo
        self.interval = interval
        self.hold_s = hold_s
        self.clock = clock
        self.max_pending = max_pending
        self._q = _Queue()
        self.db_up: bool | None = None
        self.last_error = ""
        self.rows_written = 0
        self.steps_written = 0
        self.dropped = 0  # rows dropped by the bound while the database was down
        self.rejected = 0  # rows the database refused for their content
        # The first step of overload (the recorder source's ``coarse``, wired by the service):
        # the stored step series keeps one step per engine per ``coarse_step_s``, and counts the
        # others; the rings, and so the snapshots, keep every step.
        self.coarse: Callable[[], bool] = lambda: False
        self.coarse_step_s = 0.1
        self.steps_thinned = 0
        self._kept_at: dict[str, float] = {}
        self._release: Callable[[bool], None] | None = None  # ingest's steps now due (steps_from)
        self._held: Callable[[], int] | None = None  # how many steps ingest holds for the writer
        self.flushes = 0
        self.last_flush_s = 0.0
        self.last_ok: float | None = None
        # Events offered, ever, and how many of the first of them are written (or dropped by the
        # bound, or refused, and counted): the barrier the kernel log's resume mark waits for.
        self.events_offered = 0
        self.events_written_through = 0
        self._in_flight = 0  # flushes writing now
        self._given_back = 0  # batches the database did not take, ever

    # -- the queue (called on the event loop by ingest) ------------------------------------
    def steps_from(self, release: Callable[[bool], None], held: Callable[[], int] | None = None) -> None:
        """Ingest's hand-over of the steps now due (all of them with True: at stop), called
        before each flush takes the queue; ``held``: how many steps ingest holds for it (in
        ``pending_rows``)."""
        self._release = release
        self._held = held

    def offer_steps(self, batch: StepBatch) -> None:
        """One engine's merged steps as columns, each step final (ingest held it until both
        halves were due): written at the next flush as they are. While ``coarse`` (overload),
        one step per engine per ``coarse_step_s`` is kept and the others counted."""
        if not len(batch):
            return
        if self.coarse():
            batch = self._thin(batch)
            if not len(batch):
                return
        q = self._q
        q.batches.append(batch)
        q.seen[batch.engine] = float(batch.cols["ts"][-1])
        self._bound_batches(q)

    def _thin(self, batch: StepBatch) -> StepBatch:
        ts = batch.cols["ts"]
        kept_at = self._kept_at.get(batch.engine)
        keep = np.zeros(len(ts), dtype=bool)
        for i, t in enumerate(ts.tolist()):  # sequential: each kept step sets the next mark
            if kept_at is not None and 0 <= t - kept_at < self.coarse_step_s - 1e-6:
                continue
            keep[i] = True
            kept_at = t
        if kept_at is not None:
            self._kept_at[batch.engine] = kept_at
        thinned = int((~keep).sum())
        if not thinned:
            return batch
        self.steps_thinned += thinned
        return StepBatch(batch.engine, batch.cols[keep])

    def _bound_batches(self, q: _Queue) -> None:
        over = sum(len(b) for b in q.batches) - self.max_pending
        while over > 0 and q.batches:
            first = q.batches[0]
            if len(first) <= over:
                q.batches.pop(0)
                self.dropped += len(first)
                over -= len(first)
            else:
                q.batches[0] = StepBatch(first.engine, first.cols[over:].copy())
                self.dropped += over
                over = 0

    def offer_gpu(self, s: GpuSample) -> None:
        self._bounded(self._q.gpu).append(s)

    def offer_scrape(self, s: MetricsScrape) -> None:
        self._bounded(self._q.scrapes).append(s)

    def offer_event(self, ev: Event) -> None:
        self._bounded(self._q.events).append(ev)
        self.events_offered += 1

    def amend_event(self, ev: Event) -> None:
        _replace_queued(self._q.events, ev)

    def ticket(self) -> int:
        """The events offered so far: ``passed(ticket)`` once every one of them is written."""
        return self.events_offered

    def passed(self, ticket: int) -> bool:
        return self.events_written_through >= ticket

    def forget(self, engine: str) -> None:
        """A departed engine (``collector.ingest.departures``): its thinning mark goes; what is
        queued for it is still written."""
        self._kept_at.pop(engine, None)

    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None:
        self._q.fingerprints[engine] = facts

    def _bounded(self, items: list[Any]) -> list[Any]:
        if len(items) >= self.max_pending:
            del items[: len(items) - self.max_pending + 1]
            self.dropped += 1
        return items

    @property
    def pending_rows(self) -> int:
        q = self._q
        held = self._held() if self._held is not None else 0
        return held + sum(len(b) for b in q.batches) + len(q.gpu) + len(q.scrapes) + len(q.events)

    # -- writing ------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await sleep_to_tick(self.interval)
            await self.flush()

    def _take(self, *, everything: bool) -> _Queue:
        if self._release is not None:
            try:
                self._release(everything)
            except Exception:  # the other rows are still written
                log.exception("ingest's steps could not be taken")
        q, due = self._q, _Queue()
        due.batches, q.batches = q.batches, []
        due.gpu, q.gpu = q.gpu, []
        due.scrapes, q.scrapes = q.scrapes, []
        due.events, q.events = q.events, []
        due.fingerprints, q.fingerprints = q.fingerprints, {}
        due.seen, q.seen = q.seen, {}
        return due

    def _give_back(self, batch: _Queue) -> None:
        """A batch the database did not take goes back in front, within the bound."""
        q = self._q
        q.batches = batch.batches + q.batches
        self._bound_batches(q)
        for name in ("gpu", "scrapes", "events"):
            items = getattr(batch, name) + getattr(q, name)
            if len(items) > self.max_pending:
                self.dropped += len(items) - self.max_pending
                items = items[-self.max_pending :]
            setattr(q, name, items)
        q.fingerprints = {**batch.fingerprints, **q.fingerprints}
        q.seen = {**batch.seen, **q.seen}

    async def flush(self, *, everything: bool = False) -> None:
        batch = self._take(everything=everything)
        # every event offered before this take is in this batch or an earlier one
        through, given_back = self.events_offered, self._given_back
        if not (batch.batches or batch.gpu or batch.scrapes or batch.events or batch.fingerprints or batch.seen):
            self._written_through(through, given_back)
            return
        t0 = time.perf_counter()
        # on the loop, where the events were offered
        events = [event_row(e) for e in batch.events]
        self._in_flight += 1
        try:
            written = await asyncio.to_thread(self._write, batch, events)
        except StorageError as exc:
            if self.db_up is not False:
                log.error("database write failed, holding %d rows in memory: %s", self.pending_rows, exc)
            self.db_up, self.last_error = False, str(exc)
            self._give_back(batch)
            self._given_back += 1
            return
        finally:
            self._in_flight -= 1
        self._written_through(through, given_back)
        if self.db_up is False:
            log.warning("database is back; wrote the rows held meanwhile")
        self.db_up, self.last_error, self.last_ok = True, "", time.time()
        self.flushes += 1
        self.rows_written += written
        self.last_flush_s = time.perf_counter() - t0

    def _written_through(self, through: int, given_back: int) -> None:
        """A flush that took every event offered before ``through`` is done: they are written,
        unless another flush still writes some of them or gave some back meanwhile."""
        if self._in_flight == 0 and self._given_back == given_back:
            self.events_written_through = max(self.events_written_through, through)

    def _write(self, batch: _Queue, events: list[dict[str, Any]]) -> int:
        n_steps = sum(len(b) for b in batch.batches)
        gpu = [gpu_row(s) for s in batch.gpu]
        scrapes = [scrape_row(s) for s in batch.scrapes]
        try:
            self.repo.write_batch([], gpu, events, batch.seen, scrapes=scrapes, step_batches=batch.batches)
        except StorageError as exc:
            if not exc.permanent:
                raise
            # One bad row must not block every row behind it: write kinds apart, then rows
            # one by one within the kind that failed, and set aside what is refused.
            tuples = [(b.engine, *row) for b in batch.batches for row in b.tuples()]
            steps = [dict(zip(STEP_TUPLE, row, strict=True)) for row in tuples]
            self.rejected += self._write_apart(steps, gpu, events, scrapes, batch.seen)
            log.error("database refused %d row(s) of a batch: %s", self.rejected, exc)
        for name, facts in batch.fingerprints.items():
            self.repo.update_engine(name, fingerprint=redact(facts), vllm_version=str(facts.get("vllm_version") or "")[:64] or None)
        self.steps_written += n_steps
        return n_steps + len(gpu) + len(events) + len(scrapes)

    def _write_apart(
        self,
        steps: list[dict[str, Any]],
        gpu: list[dict[str, Any]],
        events: list[dict[str, Any]],
        scrapes: list[dict[str, Any]],
        seen: dict[str, float],
    ) -> int:
        refused = 0
        kinds: list[tuple[str, list[dict[str, Any]]]] = [("steps", steps), ("gpu", gpu), ("events", events), ("scrapes", scrapes)]
        for kind, rows in kinds:
            for row in rows:
                args: dict[str, Any] = {"steps": [], "gpu_samples": [], "events": [], "scrapes": []}
                args[{"gpu": "gpu_samples"}.get(kind, kind)] = [row]
                try:
                    self.repo.write_batch(args["steps"], args["gpu_samples"], args["events"], None, scrapes=args["scrapes"])
                except StorageError as exc:
                    if not exc.permanent:
                        raise
                    refused += 1
        self.repo.write_batch([], [], [], seen)
        return refused
