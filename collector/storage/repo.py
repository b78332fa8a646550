"""The stores over one database, one class a job, behind the one object the API, the CLI and
the sidecar are given: engines and GPUs (``engines``), the continuous series (``series``),
event rows (``events``), incidents (``incidents``), snapshots (``snapshots``) and retention
(``retention``). Driver errors become ``StorageError`` (``database``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from collector.columns import StepBatch
from collector.snapshot.document import PARTS, SnapshotDoc
from collector.storage import retention
from collector.storage.cursor import SUMMARY_COLUMNS, BadCursor, SnapshotFilter, decode_cursor, encode_cursor
from collector.storage.database import Database, NotFound, nul_free
from collector.storage.engines import EngineStore
from collector.storage.events import EventStore
from collector.storage.incidents import IncidentStore
from collector.storage.series import STEP_TUPLE, SeriesStore
from collector.storage.snapshots import SnapshotAmend, SnapshotCommit, SnapshotStore, pack_parts

__all__ = [
    "STEP_TUPLE",
    "SUMMARY_COLUMNS",
    "BadCursor",
    "NotFound",
    "Repository",
    "SnapshotAmend",
    "SnapshotCommit",
    "SnapshotFilter",
    "decode_cursor",
    "encode_cursor",
    "nul_free",
    "pack_parts",
]


class Repository:
    def __init__(self, db: Engine, *, host: str) -> None:
        self.database = Database(db, host=host)
        self.engines = EngineStore(self.database)
        self.series = SeriesStore(self.database, self.engines)
        self.events = EventStore(self.database)
        self.incidents = IncidentStore(self.database)
        self.snapshots = SnapshotStore(self.database, self.events, self.incidents)

    @property
    def db(self) -> Engine:
        return self.database.db

    @property
    def host(self) -> str:
        return self.database.host

    @property
    def dialect(self) -> str:
        return self.database.dialect

    # -- engines and GPUs -------------------------------------------------------------------------
    def engine_id(self, conn: Connection, name: str, *, url: str | None = None, pair: str | None = None) -> int:
        return self.engines.engine_id(conn, name, url=url, pair=pair)

    def register_engine(self, name: str, *, url: str | None, pair: str | None) -> int:
        return self.engines.register(name, url=url, pair=pair)

    def update_engine(self, name: str, **values: Any) -> None:
        self.engines.update(name, **values)

    def list_engines(self) -> list[dict[str, Any]]:
        return self.engines.list_engines()

    def list_gpus(self) -> list[dict[str, Any]]:
        return self.engines.list_gpus()

    # -- the continuous series and retention ------------------------------------------------------
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
        self.series.write_batch(steps, gpu_samples, events, seen, scrapes=scrapes, step_batches=step_batches)

    def recent_steps(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        return self.series.recent_steps(engine, since=since)

    def binned_steps(self, *, host: str, engine: str, since: float, until: float, bin_s: float) -> list[dict[str, Any]]:
        return self.series.binned_steps(host=host, engine=engine, since=since, until=until, bin_s=bin_s)

    def recent_scrapes(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        return self.series.recent_scrapes(engine, since=since)

    def prune(
        self,
        *,
        steps_before: float,
        gpu_before: float,
        events_before: float,
        snapshots_before: float | None,
        step_seconds_before: float | None = None,
    ) -> dict[str, int]:
        return retention.prune(
            self.database,
            self.series.steps,
            steps_before=steps_before,
            gpu_before=gpu_before,
            events_before=events_before,
            snapshots_before=snapshots_before,
            step_seconds_before=step_seconds_before,
        )

    # -- events -----------------------------------------------------------------------------------
    def link_event(self, ev: dict[str, Any], snapshot_id: int) -> int:
        """Late evidence of a committed snapshot: linked, and its crash signature amended."""
        return self.snapshots.add_evidence(ev, snapshot_id)

    def list_events(self, **filters: Any) -> list[dict[str, Any]]:
        return self.events.list_events(**filters)

    # -- snapshots and incidents ------------------------------------------------------------------
    def commit_snapshots(self, items: Sequence[SnapshotCommit | SnapshotAmend], *, incident_window_s: float) -> list[tuple[int, bool]]:
        return self.snapshots.commit(items, incident_window_s=incident_window_s)

    def store_snapshot(
        self, doc: SnapshotDoc, *, incident_window_s: float, incident_key: str, blobs: dict[str, bytes] | None = None
    ) -> tuple[int, int]:
        """One snapshot committed on its own (tools, tests): (snapshot id, incident id)."""
        [(sid, _)] = self.commit_snapshots([SnapshotCommit(doc, incident_key, blobs=blobs)], incident_window_s=incident_window_s)
        return sid, int(doc.incident_id or 0)

    def amend_snapshot(self, snap_id: int, doc: SnapshotDoc, *, blobs: dict[str, bytes] | None = None, counts: dict[str, Any] | None = None) -> None:
        """Replace a snapshot's parts and summary with a later freeze of the same fault (tools)."""
        self.commit_snapshots([SnapshotAmend(snap_id, doc, blobs=blobs, counts=counts)], incident_window_s=0.0)

    def snapshot_for_trigger(self, engine: str, trigger_uid: str, *, host: str | None = None) -> int | None:
        return self.snapshots.for_trigger(engine, trigger_uid, host=host)

    def list_snapshots(self, flt: SnapshotFilter, *, limit: int = 50, cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        return self.snapshots.list(flt, limit=limit, cursor=cursor)

    def get_snapshot_blobs(self, snap_id: int, *, parts: Sequence[str] = PARTS) -> tuple[SnapshotDoc, dict[str, bytes]]:
        return self.snapshots.get_blobs(snap_id, parts=parts)

    def get_snapshot(self, snap_id: int, *, parts: Sequence[str] = PARTS) -> SnapshotDoc:
        return self.snapshots.get(snap_id, parts=parts)

    def snapshot_count(self) -> int:
        return self.snapshots.count()

    def add_replay(self, snap_id: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
        return self.snapshots.add_replay(snap_id, entry)

    def list_incidents(self, *, limit: int = 50, before_id: int | None = None) -> list[dict[str, Any]]:
        return self.incidents.list_incidents(limit=limit, before_id=before_id)

    def get_incident(self, incident_id: int) -> dict[str, Any]:
        return self.incidents.get_incident(incident_id)
