"""A node's rows in the split placement (``fleet/placement.py``): the ingest hub's row sink.

Per-step series (steps, GPU samples, scrapes) go to the node-local writer as before, when there
is a node-local store. What the shared store takes (events, engines' facts and last-seen times,
GPUs, the coarse series made here from the same steps and samples) goes through the outbox
(``fleet/outbox.py``): every ``interval`` the forwarder puts what came in as a few outbox rows
(one local transaction), then ships the outbox in order to the shared store, one transaction
per batch, and deletes each batch once the shared store committed it.

The hub's calls are on the event loop and cost an append (per step, no per-row object); the
grouping into intervals, the JSON and both stores' I/O run in a thread. A shared store that is
down or slow never reaches the loop or the node-local writer: the outbox grows and is shipped
when the store answers again, oldest first, ``ship_batches`` batches a round.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from collector.columns import StepBatch
from collector.fleet.coarse import Coarsener
from collector.fleet.outbox import Batch, MemoryOutbox, Outbox
from collector.model import Event, GpuSample, MetricsScrape
from collector.redact import redact
from collector.storage.connect import StorageError, translate
from collector.storage.models import EngineSeriesRow, GpuRow, GpuSeriesRow
from collector.storage.repo import Repository
from collector.storage.writer import HOLD_S, BatchWriter, event_row  # (the hold with no node-local writer)

log = logging.getLogger(__name__)

SHIP_BATCHES = 64  # outbox rows shipped a round (a round after an outage catches up this many)


class FleetRows:
    def __init__(
        self,
        *,
        shared: Repository,
        outbox: Outbox,
        local: BatchWriter | None,
        host: str,
        interval_s: float = 10.0,
        flush_every: float = 1.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.shared = shared
        self.outbox = outbox
        self.local = local
        self.flush_every = flush_every
        self.clock = clock
        self.coarse = Coarsener(host=host, interval_s=interval_s)
        self._steps: list[StepBatch] = []  # merged, final steps (ingest held them)
        self._release: Callable[[bool], None] | None = None
        self._gpu: list[GpuSample] = []
        self._events: list[Event] = []
        self._facts: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, float] = {}
        self._seen_held: dict[str, float] = {}  # last-seen times not sent yet (the thread's)
        self._seen_sent = 0.0
        self._gpus_told: set[str] = set()
        self._new_gpus: list[GpuSample] = []
        self._unput: list[tuple[str, list[dict[str, Any]]]] = []  # batches the outbox refused (local disk)
        # one round at a time: the stop's last round waits for a periodic one in flight (the
        # coarse series and the outbox are the thread's, and two rounds at once lose steps)
        self._round_lock = asyncio.Lock()
        # figures (/healthz, the benchmark)
        self.shared_up: bool | None = None
        self.last_error = ""
        self.batches_shipped = 0
        self.rows_shipped = 0
        self.rejected = 0
        self.ship_seconds: list[float] = []  # each shipped batch's commit time (the last 4096)
        self.backlog = 0
        self.events_offered = 0
        self.events_written_through = 0

    # -- the row sink (on the loop) -------------------------------------------------------------
    @property
    def hold_s(self) -> float:
        """How long ingest holds a step before handing it over (the node-local writer's)."""
        return self.local.hold_s if self.local is not None else HOLD_S

    def steps_from(self, release: Callable[[bool], None], held: Callable[[], int] | None = None) -> None:
        """Ingest's hand-over of the steps now due: before the node-local writer's flushes, or
        (without one) before this forwarder's rounds."""
        if self.local is not None:
            self.local.steps_from(release, held)
        else:
            self._release = release

    def offer_steps(self, batch: StepBatch) -> None:
        if not len(batch):
            return
        if self.local is not None:
            self.local.offer_steps(batch)
        self._steps.append(batch)
        self._seen[batch.engine] = float(batch.cols["ts"][-1])

    def offer_gpu(self, s: GpuSample) -> None:
        if self.local is not None:
            self.local.offer_gpu(s)
        self._gpu.append(s)
        if s.gpu not in self._gpus_told:
            self._gpus_told.add(s.gpu)
            self._new_gpus.append(s)

    def offer_scrape(self, s: MetricsScrape) -> None:
        if self.local is not None:
            self.local.offer_scrape(s)

    def offer_event(self, ev: Event) -> None:
        self._events.append(ev)
        self.events_offered += 1

    def amend_event(self, ev: Event) -> None:
        for i, queued in enumerate(self._events):
            if queued.uid == ev.uid:
                self._events[i] = ev

    # -- the barrier the kernel log's resume mark waits for (``sources/kmsg_mark.py``) ------------
    def ticket(self) -> int:
        """The events offered so far: ``passed(ticket)`` once every one of them is durable (in the
        node-local outbox; without one, shipped to the shared store)."""
        return self.events_offered

    def passed(self, ticket: int) -> bool:
        return self.events_written_through >= ticket

    def forget(self, engine: str) -> None:
        """A departed engine (``collector.ingest.departures``): what is queued for it is still
        sent (the queues empty every flush); the node-local writer lets go of its own."""
        if self.local is not None:
            self.local.forget(engine)

    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None:
        self._facts[engine] = facts

    # -- the rounds ------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_every)
            await self.flush()

    async def flush(self, *, everything: bool = False) -> None:
        """One round: what came in goes to the outbox, then the outbox to the shared store."""
        async with self._round_lock:
            await self._flush(everything)

    async def _flush(self, everything: bool) -> None:
        if self._release is not None:
            self._release(everything)
        due_steps, self._steps = self._steps, []
        gpu, self._gpu = self._gpu, []
        events, self._events = self._events, []
        facts, self._facts = self._facts, {}
        seen, self._seen = self._seen, {}
        new_gpus, self._new_gpus = self._new_gpus, []
        through = self.events_offered  # every event offered so far is in this round or an earlier one
        durable = await asyncio.to_thread(self._round, due_steps, gpu, events, facts, seen, new_gpus, everything)
        if durable:
            self.events_written_through = max(self.events_written_through, through)
        if everything:  # at stop: what this run shipped, for the log (bench/bench_fleet.py reads it)
            log.info("fleet forwarder: %s", json.dumps(self.figures(), sort_keys=True))

    def _round(
        self,
        steps: list[StepBatch],
        gpu: list[GpuSample],
        events: list[Event],
        facts: dict[str, dict[str, Any]],
        seen: dict[str, float],
        new_gpus: list[GpuSample],
        everything: bool,
    ) -> bool:
        """One round in the thread; True when everything it was given is durable."""
        self.coarse.add_steps((b.engine, *row) for b in steps for row in b.tuples())
        self.coarse.add_gpu(gpu)
        e_rows, g_rows = self.coarse.closed(time.time(), everything=everything)
        # last-seen times go out once an interval (an UPDATE a second per node is 1,000/s at
        # 1,000 nodes), a changed fingerprint at once
        self._seen_held.update(seen)
        now = time.monotonic()
        if facts or everything or now - self._seen_sent >= self.coarse.interval_s:
            seen, self._seen_held, self._seen_sent = self._seen_held, {}, now
        else:
            seen = {}
        engines = [
            {"name": n, "last_seen": seen.get(n), "fingerprint": redact(facts[n]) if n in facts else None} for n in sorted(set(seen) | set(facts))
        ]
        batches = [
            *self._unput,
            ("events", [event_row(e) for e in events]),
            ("engines", engines),
            ("gpus", [{"gpu": s.gpu, "index": s.index, "bus_id": s.bus_id, "name": s.name} for s in new_gpus]),
            ("engine_series", e_rows),
            ("gpu_series", g_rows),
        ]
        batches = [(k, rows) for k, rows in batches if rows]
        try:
            self.outbox.put(batches)
            self._unput = []
        except StorageError as exc:
            self._unput = batches  # the local disk refused: held here, put again next round
            log.error("outbox: the node-local store refused %d batch(es), held in memory: %s", len(batches), exc)
        self._ship()
        if self._unput:
            return False
        # on the node's disk once put; in memory only (no node-local store) until shipped
        return not isinstance(self.outbox, MemoryOutbox) or self.backlog == 0

    def _ship(self) -> None:
        try:
            todo = self.outbox.take(SHIP_BATCHES)
        except StorageError as exc:
            log.error("outbox unreadable: %s", exc)
            return
        for batch in todo:
            t0 = time.perf_counter()
            try:
                self._write(batch)
            except StorageError as exc:
                if exc.permanent:  # the shared store refuses these rows for their content: set aside
                    self.rejected += len(batch[2])
                    log.error("shared store refused an outbox batch of %d %s row(s): %s", len(batch[2]), batch[1], exc)
                else:
                    if self.shared_up is not False:
                        log.error("shared store unreachable, rows wait in the outbox: %s", exc)
                    self.shared_up, self.last_error = False, str(exc)
                    break
            else:
                self.ship_seconds.append(time.perf_counter() - t0)
                del self.ship_seconds[:-4096]
                self.batches_shipped += 1
                self.rows_shipped += len(batch[2])
                if self.shared_up is False:
                    log.warning("shared store is back: shipping the outbox")
                self.shared_up, self.last_error = True, ""
            try:
                self.outbox.done([batch[0]])
            except StorageError as exc:  # shipped again next round: idempotent on the shared side
                log.error("outbox: could not remove a shipped batch: %s", exc)
                break
        try:
            self.backlog = self.outbox.depth()
        except StorageError:
            pass

    def _write(self, batch: Batch) -> None:
        _, kind, rows = batch
        repo = self.shared
        if kind == "events":
            repo.write_batch([], [], rows, None)
        elif kind == "engines":
            for r in rows:
                values: dict[str, Any] = {}
                if r.get("last_seen") is not None:
                    values["last_seen"] = r["last_seen"]
                if r.get("fingerprint") is not None:
                    values["fingerprint"] = r["fingerprint"]
                    values["vllm_version"] = str(r["fingerprint"].get("vllm_version") or "")[:64] or None
                repo.update_engine(r["name"], **values)
        elif kind in ("gpus", "engine_series", "gpu_series"):
            self._insert_ignore(kind, rows)
        else:
            raise StorageError(f"outbox batch of unknown kind {kind!r}", permanent=True)

    def _insert_ignore(self, kind: str, rows: list[dict[str, Any]]) -> None:
        now = time.time()
        if kind == "gpus":
            table: Any = GpuRow
            keys = ["host", "gpu"]
            rows = [dict(r, host=self.shared.host, first_seen=now, last_seen=now) for r in rows]
        else:
            table = EngineSeriesRow if kind == "engine_series" else GpuSeriesRow
            keys = ["host", "engine" if kind == "engine_series" else "gpu", "ts", "part"]
        if self.shared.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert  # type: ignore[assignment]
        try:
            with self.shared.db.begin() as conn:
                conn.execute(dialect_insert(table).on_conflict_do_nothing(index_elements=keys), rows)
        except SQLAlchemyError as exc:
            raise translate(exc) from exc

    def figures(self) -> dict[str, Any]:
        times = sorted(self.ship_seconds)

        def pct(q: float) -> float | None:  # None: nothing shipped yet (unknown, not 0)
            return round(times[min(len(times) - 1, int(q * len(times)))], 6) if times else None

        return {
            "ship_p50_s": pct(0.50),
            "ship_p99_s": pct(0.99),
            "ship_max_s": round(times[-1], 6) if times else None,
            "shared_up": self.shared_up,
            "shared_error": self.last_error or None,
            "outbox_batches": self.backlog,
            "outbox_dropped": self.outbox.dropped,
            "batches_shipped": self.batches_shipped,
            "rows_shipped": self.rows_shipped,
            "rows_rejected": self.rejected,
        }
