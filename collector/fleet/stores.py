"""The stores a node opens for its placement (``fleet/placement.py``), their migrations, the row
sink ingest writes to, and retention over both."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from collector.fleet.forwarder import FleetRows
from collector.fleet.outbox import MemoryOutbox, Outbox, SqlOutbox
from collector.fleet.placement import Placement
from collector.storage import partitions
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter

log = logging.getLogger(__name__)


@dataclass
class Stores:
    placement: Placement
    primary: Repository  # snapshots, incidents, events, engines, GPUs (the shared store when split)
    local: Repository | None = None  # split only: the node-local store of per-step series
    engines: list[Engine] = field(default_factory=list)

    @property
    def series(self) -> Repository:
        """Where the per-step series are written: the node-local store, or the one store."""
        return self.local or self.primary

    @property
    def urls(self) -> list[str]:
        p = self.placement
        return [u for u in (p.local, p.shared) if u is not None]

    def upgrade(self) -> None:
        """Migrate every store to head; raises StorageError for the first that fails. (The
        sidecar migrates in child processes instead: Alembic, imported here only, stays out of it.)"""
        from collector.storage.migrate import upgrade  # noqa: PLC0415

        for url in self.urls:
            upgrade(url)

    def dispose(self) -> None:
        for db in self.engines:
            db.dispose()


def open_stores(place: Placement, *, host: str) -> Stores:
    primary_db = make_engine(place.primary)
    stores = Stores(placement=place, primary=Repository(primary_db, host=host), engines=[primary_db])
    if place.split and place.local is not None:
        local_db = make_engine(place.local)
        stores.local = Repository(local_db, host=host)
        stores.engines.append(local_db)
    return stores


def row_sink(stores: Stores, writer: BatchWriter, *, host: str, interval_s: float) -> BatchWriter | FleetRows:
    """What ingest offers its rows to: the writer (one store), or the fleet forwarder (split),
    which hands the per-step series to the writer when there is a node-local store."""
    if not stores.placement.split:
        return writer
    outbox: Outbox = SqlOutbox(stores.local.db) if stores.local is not None else MemoryOutbox()
    return FleetRows(shared=stores.primary, outbox=outbox, local=writer if stores.local is not None else None, host=host, interval_s=interval_s)


def prune(stores: Stores, retention: Any, *, partition_hours: float, now: float | None = None) -> dict[str, Any]:
    """One retention pass. The per-step series store is pruned by DELETE (SQLite, a node's
    hours of steps); a Postgres store has its time partitions created ahead and the old ones
    dropped (events after ``events_days``, the coarse series after ``coarse_days``), and its events are
    not DELETEd row by row. Raises StorageError."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {}
    keep_events = retention.events_days * 86400
    for repo in {id(r): r for r in (stores.series, stores.primary)}.values():
        pg = repo.dialect == "postgresql"
        counts = repo.prune(
            steps_before=now - retention.steps_hours * 3600,
            step_seconds_before=now - retention.step_seconds_hours * 3600,
            gpu_before=now - retention.gpu_samples_hours * 3600,
            events_before=0.0 if pg else now - keep_events,
            snapshots_before=None if retention.snapshots_days is None or repo is not stores.primary else now - retention.snapshots_days * 86400,
        )
        out.update({k: v for k, v in counts.items() if v})
        if pg:
            keep = {t: keep_events if t == "events" else retention.coarse_days * 86400 for t in partitions.PARTITIONED}
            made = partitions.maintain(repo.db, span_s=partition_hours * 3600, keep_s=keep, now=now)
            out["partitions"] = {t: v for t, v in made.items() if v["created"] or v["dropped"]}
    return out
