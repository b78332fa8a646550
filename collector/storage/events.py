"""Event rows and their link to the snapshot that holds them.

Two ways in: the writer's batches (``SeriesStore.write_batch``, insert-or-ignore on the id an
event got at ingest) and ``link``: the row pointing at its snapshot, inserted when the writer
has not written it (yet, or ever: a sidecar killed before its flush), else updated with the
link and its newest data (a second witness merged into it after the row was written). One row
per event id, whoever writes first."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection

from collector.storage.database import Database, nul_free
from collector.storage.models import EventRow


def stored_event_times(conn: Connection, host: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose event id is stored already take the stored row's time, so the insert-or-ignore
    on (host, uid, ts) finds it: events' unique key holds ts (Postgres partitions them by it), and
    a kernel record read again after a restart is the same event (its id from its place) with
    another reading time.

    Two transactions may store one event at once (the writer's batch and a snapshot's link of
    the same event, read twice after a restart: two reading times). Each first holds its events'
    ids until it ends (``_hold``), so the second looks only once the first's row is committed,
    and takes its time: one row per id."""
    uids = [r["uid"] for r in rows if r.get("uid")]
    if not uids:
        return rows
    _hold(conn, host, uids)
    have = dict(conn.execute(select(EventRow.uid, EventRow.ts).where(EventRow.host == host, EventRow.uid.in_(uids))).all())
    return [dict(r, ts=have[r["uid"]]) if r.get("uid") in have else r for r in rows]


def _hold(conn: Connection, host: str, uids: list[str]) -> None:
    """Hold these event ids for the rest of the transaction. Postgres: a transaction-scoped
    advisory lock per id (in one order: two holders of overlapping ids cannot deadlock). SQLite:
    the database's write lock, which an UPDATE takes even where it changes no row; a transaction
    that has written holds it already, one that has only read would otherwise look before
    taking it."""
    if conn.dialect.name == "postgresql":
        for key in sorted({f"{host}/{uid}" for uid in uids}):  # (a hash collision only serializes more)
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": key})
    elif conn.dialect.name == "sqlite":
        conn.execute(update(EventRow).where(EventRow.host == host, EventRow.uid == uids[0]).values(uid=EventRow.uid))


class EventStore:
    def __init__(self, database: Database) -> None:
        self.d = database

    def link(self, conn: Connection, ev: dict[str, Any], snapshot_id: int) -> int:
        """Inside a transaction; returns the rows that now point at the snapshot."""
        row = nul_free(dict(ev, host=self.d.host, snapshot_id=snapshot_id))
        if not row.get("uid"):  # a row written before events had ids: found by time, kind, source
            where = [EventRow.host == self.d.host, EventRow.ts == row["ts"], EventRow.kind == row["kind"], EventRow.source == row["source"]]
            linked = int(
                conn.execute(
                    update(EventRow)
                    .where(*where, EventRow.snapshot_id.is_(None) | (EventRow.snapshot_id == snapshot_id))
                    .values(snapshot_id=snapshot_id, data=row["data"])
                ).rowcount
            )
            if not linked:
                conn.execute(insert(EventRow).values(**row))
            return linked or 1
        row = stored_event_times(conn, self.d.host, [row])[0]
        conn.execute(self.d.insert_ignore(EventRow, ["host", "uid", "ts"]).values(**row))
        return int(
            conn.execute(
                update(EventRow)
                .where(
                    EventRow.host == self.d.host,
                    EventRow.uid == row["uid"],
                    EventRow.snapshot_id.is_(None) | (EventRow.snapshot_id == snapshot_id),
                )
                .values(snapshot_id=snapshot_id, data=row["data"])
            ).rowcount
        )

    def link_event(self, ev: dict[str, Any], snapshot_id: int) -> int:
        """``link`` in its own transaction (late evidence; a retaken trigger's stored snapshot)."""
        with self.d.tx() as conn:
            return self.link(conn, ev, snapshot_id)

    def list_events(
        self,
        *,
        kind: str | None = None,
        engine: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        q = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
        if kind:
            q = q.where(EventRow.kind == kind)
        if engine:
            q = q.where(EventRow.engine == engine)
        if since is not None:
            q = q.where(EventRow.ts >= since)
        if until is not None:
            q = q.where(EventRow.ts < until)
        if before_id is not None:
            q = q.where(EventRow.id < before_id)
        with self.d.tx() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]
