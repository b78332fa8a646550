"""The continuous series: steps, scrapes, GPU samples and the events the writer batches, written
one batch per transaction, and read back per engine. Steps are stored as chunks (``steps``), a
scrape's figures packed (``scrapepack``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from collector.columns import STEP_COLUMNS, StepBatch
from collector.storage.connect import StorageError
from collector.storage.database import Database, nul_free
from collector.storage.engines import EngineStore
from collector.storage.events import stored_event_times
from collector.storage.models import EngineRow, EngineScrapeRow, EventRow, GpuSampleRow
from collector.storage.scrapepack import pack, unpack
from collector.storage.steps import Cols, StepStore, rows_to_cols

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
        self.steps = StepStore(database)
        self._statements: dict[str, str] = {}

    def write_batch(
        self,
        steps: Sequence[dict[str, Any]],
        gpu_samples: Sequence[dict[str, Any]],
        events: Sequence[dict[str, Any]],
        seen: dict[str, float] | None = None,
        *,
        scrapes: Sequence[dict[str, Any]] = (),
        step_batches: Sequence[StepBatch] = (),
    ) -> None:
        """One transaction for a batch of the continuous series (the writer's flush). A step
        already stored (a ring read again after a restart) is skipped, not duplicated.

        Steps come as column batches (``step_batches``: ``collector.columns.StepBatch``, the
        writer's form) or as dicts (``steps``: ``STEP_TUPLE``'s keys); each engine's are stored as chunks (``steps.StepStore``)."""
        engine_id = self.engines.engine_id
        by_engine: dict[str, list[Cols]] = {}
        for batch in step_batches:
            if len(batch):
                by_engine.setdefault(batch.engine, []).append(batch.cols)
        rows: dict[str, list[Sequence[Any]]] = {}
        for d in steps:
            rows.setdefault(d["engine"], []).append([d.get(c) for c in STEP_COLUMNS])
        for name, listed in rows.items():
            try:
                by_engine.setdefault(name, []).append(rows_to_cols(listed))
            except (OverflowError, TypeError, ValueError) as exc:  # a figure no column can hold
                raise StorageError(f"step of {name}: {exc}", permanent=True) from exc
        with self.d.tx() as conn:
            if by_engine:
                self.steps.write(conn, {engine_id(conn, name): cols for name, cols in by_engine.items()})
            if scrapes:
                # the driver's executemany on a statement built once: the ORM's insert of a
                # list of dicts, and an UPDATE built per engine below, cost ~150 us a row
                conn.exec_driver_sql(
                    self._sql("scrapes"),
                    [
                        (engine_id(conn, s["engine"]), s["ts"], s.get("running"), s.get("waiting"), s.get("kv_cache_usage"), pack(s["values"]))
                        for s in scrapes
                    ],
                )
            if gpu_samples:
                gpu_rows = []
                for g in gpu_samples:
                    g = dict(g)
                    g["gpu_id"] = self.engines.gpu_id(conn, g.pop("gpu"), index=g.pop("index"), bus_id=g.pop("bus_id"), name=g.pop("name"))
                    gpu_rows.append(g)
                conn.execute(insert(GpuSampleRow), gpu_rows)
            if events:
                # insert-or-ignore on (host, uid): a snapshot's commit may have stored the row first
                event_rows = stored_event_times(conn, self.d.host, [nul_free(dict(e, host=self.d.host)) for e in events])
                conn.execute(self.d.insert_ignore(EventRow, ["host", "uid", "ts"]), event_rows)
            if seen:
                conn.exec_driver_sql(self._sql("seen"), [(ts, engine_id(conn, name)) for name, ts in seen.items()])

    def _sql(self, name: str) -> str:
        """The writer's two statements in the driver's own form (its parameter marks)."""
        sql = self._statements.get(name)
        if sql is None:
            mark = self.d.param_mark
            if name == "scrapes":
                cols = ("engine_id", "ts", "running", "waiting", "kv_cache_usage", "packed")
                sql = f"INSERT INTO {EngineScrapeRow.__tablename__} ({', '.join(cols)}) VALUES ({', '.join([mark] * len(cols))})"
            else:
                sql = f"UPDATE {EngineRow.__tablename__} SET last_seen = {mark} WHERE id = {mark}"  # noqa: S608 - our own names
            self._statements[name] = sql
        return sql

    def recent_scrapes(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        c = EngineScrapeRow
        q = (
            select(c.id, c.engine_id, c.ts, c.running, c.waiting, c.kv_cache_usage, c.values, c.packed)
            .join(EngineRow, EngineRow.id == c.engine_id)
            .where(EngineRow.name == engine, EngineRow.host == self.d.host, c.ts >= since)
            .order_by(c.ts)
        )
        with self.d.tx() as conn:
            rows = [dict(r) for r in conn.execute(q).mappings()]
        for r in rows:
            packed = r.pop("packed")
            if packed is not None:
                try:
                    r["values"] = unpack(bytes(packed))
                except ValueError:
                    r["values"] = None  # a damaged row: its figures are unknown
        return rows

    def _engine(self, conn: Connection, host: str, engine: str) -> int | None:
        return conn.execute(select(EngineRow.id).where(EngineRow.name == engine, EngineRow.host == host)).scalar_one_or_none()

    def recent_steps(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        """The engine's stored steps from ``since``, in time order: ``engine_id`` and the step's
        figures (``collector.columns.STEP_COLUMNS``), None for a figure nobody measured."""
        with self.d.tx() as conn:
            eid = self._engine(conn, self.d.host, engine)
            return [] if eid is None else self.steps.recent(conn, eid, since=since)

    def binned_steps(self, *, host: str, engine: str, since: float, until: float, bin_s: float) -> list[dict[str, Any]]:
        """An engine's stored steps between ``since`` and ``until``, one row per ``bin_s``
        seconds that holds any (a snapshot page's "minutes before" strip: tens of thousands of
        steps become a few hundred points): ``t`` (the bin's start), ``b`` (its number),
        ``steps``, ``running``/``waiting``/``kv_cache_usage`` (the bin's maxima),
        ``prompt_tokens``, ``generation_tokens``, ``preemptions`` (its sums). A figure no step
        carried is None."""
        with self.d.tx() as conn:
            eid = self._engine(conn, host, engine)
            return [] if eid is None else self.steps.binned(conn, eid, since=since, until=until, bin_s=bin_s)
