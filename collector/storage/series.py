"""The continuous series: steps, scrapes, GPU samples and the events the writer batches, written
one batch per transaction, and read back per engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, cast, func, insert, select, update
from sqlalchemy.engine import Connection

from collector.columns import StepBatch
from collector.storage.database import Database, nul_free
from collector.storage.engines import EngineStore
from collector.storage.events import stored_event_times
from collector.storage.models import EngineRow, EngineScrapeRow, EngineStepRow, EventRow, GpuSampleRow

# A step row in the writer's tuple form: the engine's name, then the columns (``write_batch``).
STEP_TUPLE = (
    "engine",
    "ts",
    "step",
    "run",
    "running",
    "waiting",
    "kv_cache_usage",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "mirror_rows",
    "host_blocks",
)


class SeriesStore:
    def __init__(self, database: Database, engines: EngineStore) -> None:
        self.d = database
        self.engines = engines
        self._step_sql: dict[str, str] = {}

    def write_batch(
        self,
        steps: Sequence[dict[str, Any]],
        gpu_samples: Sequence[dict[str, Any]],
        events: Sequence[dict[str, Any]],
        seen: dict[str, float] | None = None,
        *,
        scrapes: Sequence[dict[str, Any]] = (),
        step_tuples: Sequence[tuple[Any, ...]] = (),
        step_batches: Sequence[StepBatch] = (),
    ) -> None:
        """One transaction for a batch of the continuous series (the writer's flush). A step
        already stored (a ring read again after a restart) is skipped, not duplicated.

        ``step_tuples``: steps as ``STEP_TUPLE`` tuples (the engine's name first), the writer's
        form: one driver-level ``executemany`` over tuples, with no per-row dict or binding.
        ``step_batches``: steps as column batches (``collector.columns.StepBatch``)."""
        engine_id = self.engines.engine_id
        with self.d.tx() as conn:
            if step_tuples:
                self._insert_step_tuples(conn, step_tuples)
            for batch in step_batches:
                if len(batch):
                    self._insert_step_tuples(conn, [(batch.engine, *row) for row in batch.tuples()])
            if steps:
                rows = []
                for s in steps:
                    s = dict(s)
                    s["engine_id"] = engine_id(conn, s.pop("engine"))
                    rows.append(s)
                conn.execute(self.d.insert_ignore(EngineStepRow, ["engine_id", "run", "step"]), rows)
            if scrapes:
                rows = []
                for s in scrapes:
                    s = dict(s)
                    s["engine_id"] = engine_id(conn, s.pop("engine"))
                    s["values"] = nul_free(s["values"])
                    rows.append(s)
                conn.execute(insert(EngineScrapeRow), rows)
            if gpu_samples:
                rows = []
                for g in gpu_samples:
                    g = dict(g)
                    g["gpu_id"] = self.engines.gpu_id(conn, g.pop("gpu"), index=g.pop("index"), bus_id=g.pop("bus_id"), name=g.pop("name"))
                    rows.append(g)
                conn.execute(insert(GpuSampleRow), rows)
            if events:
                # insert-or-ignore on (host, uid): a snapshot's commit may have stored the row first
                rows = stored_event_times(conn, self.d.host, [nul_free(dict(e, host=self.d.host)) for e in events])
                conn.execute(self.d.insert_ignore(EventRow, ["host", "uid", "ts"]), rows)
            for name, ts in (seen or {}).items():
                eid = engine_id(conn, name)
                conn.execute(update(EngineRow).where(EngineRow.id == eid).values(last_seen=ts))

    def _insert_step_tuples(self, conn: Connection, tuples: Sequence[tuple[Any, ...]]) -> None:
        ids = {name: self.engines.engine_id(conn, name) for name in {t[0] for t in tuples}}
        rows = [(ids[t[0]], *t[1:]) for t in tuples]
        dialect = self.d.dialect
        sql = self._step_sql.get(dialect)
        if sql is None:
            cols = ", ".join(("engine_id", *STEP_TUPLE[1:]))
            mark = "%s" if self.d.db.dialect.paramstyle in ("format", "pyformat") else "?"
            marks = ", ".join([mark] * len(STEP_TUPLE))
            verb = "INSERT INTO" if dialect == "postgresql" else "INSERT OR IGNORE INTO"
            tail = " ON CONFLICT (engine_id, run, step) DO NOTHING" if dialect == "postgresql" else ""
            sql = self._step_sql[dialect] = f"{verb} engine_steps ({cols}) VALUES ({marks}){tail}"
        conn.exec_driver_sql(sql, rows)

    def recent_scrapes(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        q = (
            select(EngineScrapeRow)
            .join(EngineRow, EngineRow.id == EngineScrapeRow.engine_id)
            .where(EngineRow.name == engine, EngineRow.host == self.d.host, EngineScrapeRow.ts >= since)
            .order_by(EngineScrapeRow.ts)
        )
        with self.d.tx() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def recent_steps(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        q = (
            select(EngineStepRow)
            .join(EngineRow, EngineRow.id == EngineStepRow.engine_id)
            .where(EngineRow.name == engine, EngineRow.host == self.d.host, EngineStepRow.ts >= since)
            .order_by(EngineStepRow.ts)
        )
        with self.d.tx() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def binned_steps(self, *, host: str, engine: str, since: float, until: float, bin_s: float) -> list[dict[str, Any]]:
        """An engine's stored steps between ``since`` and ``until``, one row per ``bin_s``
        seconds, aggregated in the database (a snapshot page's "minutes before" strip: tens of
        thousands of steps become a few hundred points): ``t`` (the bin's start), ``steps``,
        ``running``/``waiting``/``kv_cache_usage`` (the bin's maxima), ``prompt_tokens``,
        ``generation_tokens``, ``preemptions`` (its sums). A figure no step carried is None."""
        offset = EngineStepRow.ts - since
        # SQLite: the offset is never negative, so CAST truncates as floor would
        b = (func.floor(offset / bin_s) if self.d.dialect == "postgresql" else cast(offset / bin_s, Integer)).label("b")
        q = (
            select(
                b,
                func.count().label("steps"),
                func.max(EngineStepRow.running).label("running"),
                func.max(EngineStepRow.waiting).label("waiting"),
                func.max(EngineStepRow.kv_cache_usage).label("kv_cache_usage"),
                func.sum(EngineStepRow.prompt_tokens).label("prompt_tokens"),
                func.sum(EngineStepRow.generation_tokens).label("generation_tokens"),
                func.sum(EngineStepRow.preemptions).label("preemptions"),
            )
            .join(EngineRow, EngineRow.id == EngineStepRow.engine_id)
            .where(EngineRow.name == engine, EngineRow.host == host, EngineStepRow.ts >= since, EngineStepRow.ts < until)
            .group_by(b)
            .order_by(b)
        )
        with self.d.tx() as conn:
            return [{**dict(r), "t": since + int(r["b"]) * bin_s} for r in conn.execute(q).mappings()]
