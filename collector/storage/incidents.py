"""Incidents: the snapshots of one fault across engines and hosts, grouped by time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from collector.snapshot.document import SnapshotDoc
from collector.storage.cursor import SUMMARY_COLUMNS
from collector.storage.database import Database, NotFound, nul_free
from collector.storage.models import IncidentRow, SnapshotRow


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
        title = f"{doc.trigger.get('kind')} on {doc.host}/{doc.engine}: {str(doc.trigger.get('message', ''))[:200]}"
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
