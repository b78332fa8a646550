"""The fleet view's reads over the shared store: crashes grouped by signature, with where each
occurred, and incidents across nodes, filtered by host, engine, model, vLLM version and Xid.

Grouping reads the snapshots' signature columns only (no JSON, no parts), newest first within
the filters and at most ``MAX_ROWS`` of them, through the indexes migration 0004 made
(signature, host, Xid, model, version; created_at for the window). One occurrence is one
incident: the P and D engines of a pair failing together are one occurrence, not two.

A group's pattern says where its occurrences fell:

- ``follows_gpu``: two or more occurrences, all on one GPU of one host: a hardware fault follows
  the GPU (drain it, whatever runs on it next);
- ``recurs_across_gpus``: two or more occurrences on different GPUs: the same software fault
  recurring (the same frames, wherever it runs);
- ``once``: a single occurrence; the snapshot's own hint (``fault_class``) is all there is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.connect import translate
from collector.storage.models import IncidentRow, SnapshotRow

MAX_ROWS = 5000
SHOWN_SNAPSHOTS = 20  # the newest snapshots listed per group


@dataclass
class FleetFilter:
    host: str | None = None
    engine: str | None = None
    model: str | None = None
    vllm_version: str | None = None
    xid: int | None = None
    fault_class: str | None = None
    since: float | None = None
    until: float | None = None

    def apply(self, q: Any) -> Any:  # a Select of any columns (SQLAlchemy 2.1 types them one by one)
        for col, value in (
            (SnapshotRow.host, self.host),
            (SnapshotRow.engine, self.engine),
            (SnapshotRow.model, self.model),
            (SnapshotRow.vllm_version, self.vllm_version),
            (SnapshotRow.xid, self.xid),
            (SnapshotRow.fault_class, self.fault_class),
        ):
            if value is not None:
                q = q.where(col == value)
        if self.since is not None:
            q = q.where(SnapshotRow.created_at >= self.since)
        if self.until is not None:
            q = q.where(SnapshotRow.created_at < self.until)
        return q


_COLS = (
    SnapshotRow.id,
    SnapshotRow.incident_id,
    SnapshotRow.host,
    SnapshotRow.engine,
    SnapshotRow.gpu,
    SnapshotRow.fault_ts,
    SnapshotRow.created_at,
    SnapshotRow.trigger_kind,
    SnapshotRow.trigger_message,
    SnapshotRow.signature,
    SnapshotRow.fault_class,
    SnapshotRow.xid,
    SnapshotRow.model,
    SnapshotRow.vllm_version,
)


def pattern(occurrences: int, gpus: set[tuple[str, str]]) -> str:
    if occurrences < 2:
        return "once"
    if len(gpus) == 1:
        return "follows_gpu"
    if len(gpus) >= 2:
        return "recurs_across_gpus"
    return "recurs"  # no GPU named (a CUDA error without an Xid): recurring, place unknown


def _verdict(pat: str, fault_class: str | None, gpus: set[tuple[str, str]], hosts: set[str], occurrences: int) -> dict[str, Any]:
    if pat == "follows_gpu":
        host, gpu = next(iter(gpus))
        return {"suspect": "hardware", "text": f"follows GPU {gpu} on {host}: {occurrences} occurrences, no other GPU"}
    if pat == "recurs_across_gpus":
        return {"suspect": "software", "text": f"recurs on {len(gpus)} GPUs across {len(hosts)} host(s): {occurrences} occurrences"}
    if pat == "recurs":
        return {"suspect": fault_class or "unknown", "text": f"{occurrences} occurrences on {len(hosts)} host(s), no GPU named"}
    return {"suspect": fault_class or "unknown", "text": "one occurrence"}


def crash_groups(db: Engine, flt: FleetFilter, *, limit: int = 50) -> list[dict[str, Any]]:
    """Snapshots grouped by crash signature, the group seen last first. Raises StorageError."""
    q = flt.apply(select(*_COLS)).order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc()).limit(MAX_ROWS)
    try:
        with db.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(q)]
            groups = _group(rows)[:limit]
            _add_details(conn, groups)
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    return groups


def _group(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_sig: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_sig[r["signature"] or f"unsigned:{r['id']}"].append(r)  # before 0004: each its own
    out = []
    for sig, members in by_sig.items():
        incidents = {m["incident_id"] if m["incident_id"] is not None else -m["id"] for m in members}
        gpus = {(m["host"], m["gpu"]) for m in members if m["gpu"]}
        hosts = {m["host"] for m in members}
        newest = members[0]
        pat = pattern(len(incidents), gpus)
        out.append(
            {
                "signature": None if sig.startswith("unsigned:") else sig,
                "occurrences": len(incidents),
                "snapshots": len(members),
                "pattern": pat,
                **_verdict(pat, newest["fault_class"], gpus, hosts, len(incidents)),
                "fault_class": newest["fault_class"],
                "hosts": sorted(hosts),
                "gpus": [{"host": h, "gpu": g} for h, g in sorted(gpus)],
                "engines": sorted({f"{m['host']}/{m['engine']}" for m in members}),
                "xid": newest["xid"],
                "model": newest["model"],
                "vllm_version": newest["vllm_version"],
                "trigger_kind": newest["trigger_kind"],
                "message": (newest["trigger_message"] or "")[:300],
                "first_fault": min(m["fault_ts"] for m in members),
                "last_fault": max(m["fault_ts"] for m in members),
                "items": [
                    {k: m[k] for k in ("id", "incident_id", "host", "engine", "gpu", "fault_ts", "trigger_kind")} for m in members[:SHOWN_SNAPSHOTS]
                ],
            }
        )
    out.sort(key=lambda g: g["last_fault"], reverse=True)
    return out


def _add_details(conn: Any, groups: list[dict[str, Any]]) -> None:
    """Each group's signature fields (frames, CUDA error, connector) from its newest snapshot."""
    ids = [g["items"][0]["id"] for g in groups if g["items"]]
    if not ids:
        return
    summaries = {r.id: r.summary for r in conn.execute(select(SnapshotRow.id, SnapshotRow.summary).where(SnapshotRow.id.in_(ids)))}
    for g in groups:
        summary = summaries.get(g["items"][0]["id"]) or {}
        g["detail"] = (summary.get("signature") if isinstance(summary, dict) else None) or None


def fleet_incidents(db: Engine, flt: FleetFilter, *, limit: int = 50) -> list[dict[str, Any]]:
    """Incidents with a snapshot that passes the filters, newest first, each with its
    snapshots' hosts, GPUs and signatures."""
    q = flt.apply(select(*_COLS).where(SnapshotRow.incident_id.is_not(None))).order_by(SnapshotRow.created_at.desc()).limit(MAX_ROWS)
    try:
        with db.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(q)]
            by_incident: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                by_incident[int(r["incident_id"])].append(r)
            wanted = sorted(by_incident, reverse=True)[:limit]
            incidents = {r.id: dict(r._mapping) for r in conn.execute(select(IncidentRow).where(IncidentRow.id.in_(wanted)))}
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    out = []
    for iid in wanted:
        inc = incidents.get(iid)
        if inc is None:
            continue
        members = by_incident[iid]
        inc["signatures"] = sorted({m["signature"] for m in members if m["signature"]})
        inc["gpus"] = sorted({f"{m['host']}/{m['gpu']}" for m in members if m["gpu"]})
        inc["snapshot_ids"] = sorted(m["id"] for m in members)
        out.append(inc)
    return out


def facets(db: Engine, *, since: float | None = None) -> dict[str, list[Any]]:
    """The values the filters can take (hosts, engines, models, versions, Xids), for the page."""
    out: dict[str, list[Any]] = {}
    try:
        with db.connect() as conn:
            for name, col in (
                ("host", SnapshotRow.host),
                ("engine", SnapshotRow.engine),
                ("model", SnapshotRow.model),
                ("vllm_version", SnapshotRow.vllm_version),
                ("xid", SnapshotRow.xid),
            ):
                q = select(col).where(col.is_not(None)).distinct().order_by(col).limit(500)
                if since is not None:
                    q = q.where(SnapshotRow.created_at >= since)
                out[name] = [r[0] for r in conn.execute(q)]
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    return out
