"""Incidents: the snapshots of one fault across engines and hosts, grouped by time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Double, Integer, String, Text, bindparam, insert, select, text, update
from sqlalchemy.engine import Connection

from collector.snapshot.document import SnapshotDoc
from collector.storage.cursor import SUMMARY_COLUMNS
from collector.storage.database import Database, NotFound, nul_free
from collector.storage.models import IncidentRow, SnapshotRow

# ``IncidentStore.file`` as one statement, for Postgres: under the store-wide lock each filing is
# one round trip, whatever the client's scheduling (tests/storage/test_incident_filing.py files
# the same faults through both and compares). Host lists are sorted as Python sorts (COLLATE "C").
_FILE_SQL = text("""
WITH cand AS (
    SELECT id, opened_at, updated_at FROM incidents
    WHERE opened_at <= :t + :w AND updated_at >= :t - :w
    ORDER BY updated_at DESC, id DESC LIMIT 8
), best AS (
    SELECT id FROM cand
    ORDER BY CASE WHEN opened_at <= :t AND :t <= updated_at THEN 0 ELSE LEAST(abs(:t - opened_at), abs(:t - updated_at)) END,
             updated_at DESC, id DESC
    LIMIT 1
), upd AS (
    UPDATE incidents i SET
        updated_at = GREATEST(i.updated_at, :t),
        opened_at = LEAST(i.opened_at, :t),
        hosts = (SELECT jsonb_agg(x ORDER BY x COLLATE "C") FROM (SELECT jsonb_array_elements_text(i.hosts) UNION SELECT :host) AS s(x)),
        engines = (SELECT jsonb_agg(x ORDER BY x COLLATE "C") FROM (SELECT jsonb_array_elements_text(i.engines) UNION SELECT :eng) AS s(x)),
        snapshot_count = i.snapshot_count + 1
    FROM best WHERE i.id = best.id
    RETURNING i.id
), ins AS (
    INSERT INTO incidents (key, title, opened_at, updated_at, trigger_kind, hosts, engines, snapshot_count)
    SELECT :key, :title, :t, :t, :kind, jsonb_build_array(:host), jsonb_build_array(:eng), 1
    WHERE NOT EXISTS (SELECT 1 FROM best)
    RETURNING id
)
UPDATE snapshots SET incident_id = (SELECT id FROM upd UNION ALL SELECT id FROM ins) WHERE id = :sid
RETURNING incident_id
""").bindparams(
    bindparam("t", type_=Double()),
    bindparam("w", type_=Double()),
    bindparam("host", type_=Text()),
    bindparam("eng", type_=Text()),
    bindparam("key", type_=String()),
    bindparam("title", type_=Text()),
    bindparam("kind", type_=String()),
    bindparam("sid", type_=Integer()),
)


class IncidentStore:
    def __init__(self, database: Database) -> None:
        self.d = database

    def file(self, conn: Connection, doc: SnapshotDoc, window: float, key: str) -> int:
        """The incident a snapshot joins, counted in: the nearest whose faults lie within
        ``window`` of its own (so a spooled snapshot committed late still finds its fault's
        incident), else a new one. Runs under the store-wide lock: one statement per step."""
        t = doc.fault_ts
        rows = (
            conn.execute(
                select(IncidentRow)
                .where(IncidentRow.opened_at <= t + window, IncidentRow.updated_at >= t - window)
                .order_by(IncidentRow.updated_at.desc())
                .limit(8)
            )
            .mappings()
            .all()
        )
        if rows:
            # the incident nearest in time: a late-committed snapshot must not join a newer one
            best = min(rows, key=lambda r: 0.0 if r["opened_at"] <= t <= r["updated_at"] else min(abs(t - r["opened_at"]), abs(t - r["updated_at"])))
            hosts = sorted(set(best["hosts"] or []) | {doc.host})
            engines = sorted(set(best["engines"] or []) | {f"{doc.host}/{doc.engine}"})
            conn.execute(
                update(IncidentRow)
                .where(IncidentRow.id == best["id"])
                .values(
                    updated_at=max(best["updated_at"], t),
                    opened_at=min(best["opened_at"], t),
                    hosts=hosts,
                    engines=engines,
                    snapshot_count=IncidentRow.snapshot_count + 1,
                )
            )
            return int(best["id"])
        title = _title(doc)
        return int(
            conn.execute(
                insert(IncidentRow)
                .values(
                    key=key,
                    title=nul_free(title),
                    opened_at=t,
                    updated_at=t,
                    trigger_kind=str(doc.trigger.get("kind")),
                    hosts=[doc.host],
                    engines=[f"{doc.host}/{doc.engine}"],
                    snapshot_count=1,
                )
                .returning(IncidentRow.id)
            ).scalar_one()
        )

    def file_snapshot(self, conn: Connection, doc: SnapshotDoc, window: float, key: str, snapshot_id: int) -> int:
        """``file`` and the snapshot pointed at its incident; on Postgres in one statement."""
        if self.d.dialect != "postgresql":
            incident_id = self.file(conn, doc, window, key)
            conn.execute(update(SnapshotRow).where(SnapshotRow.id == snapshot_id).values(incident_id=incident_id))
            return incident_id
        params = {
            "t": doc.fault_ts,
            "w": window,
            "host": doc.host,
            "eng": f"{doc.host}/{doc.engine}",
            "key": key,
            "title": nul_free(_title(doc)),
            "kind": str(doc.trigger.get("kind")),
            "sid": snapshot_id,
        }
        return int(conn.execute(_FILE_SQL, params).scalar_one())

    def list_incidents(self, *, limit: int = 50, before_id: int | None = None) -> list[dict[str, Any]]:
        q = select(IncidentRow).order_by(IncidentRow.id.desc()).limit(limit)
        if before_id is not None:
            q = q.where(IncidentRow.id < before_id)
        with self.d.tx() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def get_incident(self, incident_id: int) -> dict[str, Any]:
        with self.d.tx() as conn:
            row = conn.execute(select(IncidentRow).where(IncidentRow.id == incident_id)).mappings().first()
            if row is None:
                raise NotFound(f"incident {incident_id} not found")
            out = dict(row)
            out["snapshots"] = [
                dict(r._mapping)
                for r in conn.execute(select(*SUMMARY_COLUMNS).where(SnapshotRow.incident_id == incident_id).order_by(SnapshotRow.id))
            ]
        return out


def _title(doc: SnapshotDoc) -> str:
    return f"{doc.trigger.get('kind')} on {doc.host}/{doc.engine}: {str(doc.trigger.get('message', ''))[:200]}"
