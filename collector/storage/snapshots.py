"""Crash snapshots: committed (a batch in one transaction, filed under an incident, with their
events' rows), amended, listed and read back."""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.engine import Connection

from collector.fleet.signature import for_snapshot as crash_signature
from collector.redact import redact
from collector.snapshot.document import ENCODING, OPTIONAL_PARTS, PARTS, SnapshotDoc, pack, unpack
from collector.storage.connect import StorageError
from collector.storage.cursor import SUMMARY_COLUMNS, SnapshotFilter, decode_cursor, encode_cursor
from collector.storage.database import Database, NotFound, nul_free
from collector.storage.events import EventStore
from collector.storage.incidents import IncidentStore
from collector.storage.models import EngineRow, EventRow, SnapshotPartRow, SnapshotRow

# Several sidecars may file the same fault at once: one incident, not two (Postgres only).
INCIDENT_LOCK = 0x46_4C_52_45_43


def pack_parts(doc: SnapshotDoc) -> dict[str, bytes]:
    """The stored form of a snapshot's parts (peers are added at commit). Encode once: the
    same blobs make the spool file and the database rows. The request rows are stored as the
    recorder wrote them (``RequestTable.stored_blob``), decoded when read."""
    return {
        name: doc.requests.stored_blob() if name == "requests" else pack(doc.part(name))
        for name in PARTS
        if name != "peers" and not (name in OPTIONAL_PARTS and doc.part(name) is None)
    }


@dataclass
class SnapshotCommit:
    """A snapshot's first commit. ``trigger_uid`` makes it idempotent: a snapshot of this engine
    already stored for that trigger (a retake after a kill that came after the commit) is
    returned, not stored again. ``events`` (``event_row``s, the trigger first) are stored or
    linked in the same transaction."""

    doc: SnapshotDoc
    incident_key: str
    blobs: dict[str, bytes] | None = None
    counts: dict[str, Any] | None = None
    trigger_uid: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SnapshotAmend:
    """A later freeze of the same fault: replaces the snapshot's parts and summary."""

    snapshot_id: int
    doc: SnapshotDoc
    blobs: dict[str, bytes] | None = None
    counts: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


class SnapshotStore:
    def __init__(self, database: Database, events: EventStore, incidents: IncidentStore) -> None:
        self.d = database
        self.events = events
        self.incidents = incidents

    # -- writing --------------------------------------------------------------------------------
    def commit(self, items: Sequence[SnapshotCommit | SnapshotAmend], *, incident_window_s: float) -> list[tuple[int, bool]]:
        """Commit a batch in one transaction: (snapshot id, stored now) per item, the second
        False when its trigger's snapshot was already stored (an amendment: True).

        A snapshot joins the incident whose faults lie within ``incident_window_s`` of its own:
        TP workers failing at one step, the P and D engines of a pair, several hosts writing to
        one Postgres. The fingerprints of the engine's pair peers are stored with it, so the
        triage checklist (NCCL_NET_PLUGIN on both engines) is answerable from one snapshot.

        The snapshots and their parts (the megabytes) are inserted first, beside other nodes'
        commits; only the filing (the nearby incidents read, one updated or added, the snapshot
        pointed at it) takes the store-wide lock, so that nodes' snapshots of one fault join one
        incident while a storm's commits run side by side. The lock is transaction-scoped: it
        goes with the filing's commit, and the next filer sees this one's incident.

        On Postgres, when every new snapshot has a trigger id, the filing is a transaction of
        its own after the parts' commit: the lock is held for one statement per snapshot and a
        commit of a few rows, never for the flush of megabytes of WAL, and a filing that fails
        (the lock not had within the lock timeout) costs only itself: the retry finds the stored
        snapshot by its trigger, unfiled, and files it (returned as stored now: its first commit
        completes then). Meanwhile, for milliseconds, a reader sees the snapshot without its
        incident. Without a trigger id (a tool's commit) nothing would find it again: it is
        filed in the same transaction."""
        blobs = [dict(i.blobs) if i.blobs is not None else pack_parts(i.doc) for i in items]  # compressed outside the transaction
        out: list[tuple[int, bool]] = []
        unfiled: list[tuple[SnapshotCommit, int]] = []
        apart = self.d.dialect == "postgresql" and all(i.trigger_uid for i in items if isinstance(i, SnapshotCommit))
        with self.d.tx() as conn:
            for item, parts in zip(items, blobs, strict=True):
                if isinstance(item, SnapshotCommit):
                    sid, stored, filed = self._insert(conn, item, parts)
                    out.append((sid, stored))
                    if not filed:
                        unfiled.append((item, sid))
                else:
                    self._amend(conn, item, parts)
                    out.append((item.snapshot_id, True))
            if unfiled and not apart:
                self._file(conn, unfiled, incident_window_s)
        if unfiled and apart:
            with self.d.tx() as conn:
                self._file(conn, unfiled, incident_window_s)
        return out

    def _file(self, conn: Connection, unfiled: list[tuple[SnapshotCommit, int]], window: float) -> None:
        """The batch's new snapshots filed under their incidents, in order, under the lock."""
        if self.d.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": INCIDENT_LOCK})
        for item, snap_id in unfiled:
            incident_id = self.incidents.file_snapshot(conn, item.doc, window, item.incident_key, snap_id)
            item.doc.incident_id = incident_id

    def _insert(self, conn: Connection, item: SnapshotCommit, blobs: dict[str, bytes]) -> tuple[int, bool, bool]:
        """The snapshot's row (its incident filed later, in ``_file``), parts and events:
        (snapshot id, stored now, filed already)."""
        doc = item.doc
        if item.trigger_uid:
            have = conn.execute(
                select(SnapshotRow.id, SnapshotRow.incident_id).where(
                    SnapshotRow.host == doc.host, SnapshotRow.engine == doc.engine, SnapshotRow.trigger_uid == item.trigger_uid
                )
            ).first()
            if have is not None:
                for ev in item.events[:1]:  # the trigger's row, which the kill may have left unwritten
                    self.events.link(conn, ev, have.id)
                doc.id, doc.incident_id = have.id, have.incident_id
                if have.incident_id is None:  # an earlier attempt's, whose filing failed: its first commit completes now
                    return int(have.id), True, False
                return int(have.id), False, True
        doc.peers = self._peers(conn, doc)
        blobs["peers"] = pack(doc.peers)
        summary = dict(doc.summary)
        summary["trigger"] = {k: doc.trigger.get(k) for k in ("kind", "source", "message", "xid", "gpu", "process", "severity")}
        sig_columns, summary["signature"] = crash_signature(doc, item.events)  # the fleet view's grouping
        snap_id = conn.execute(
            insert(SnapshotRow)
            .values(
                incident_id=None,
                host=doc.host,
                engine=doc.engine,
                created_at=doc.created_at,
                fault_ts=doc.fault_ts,
                trigger_kind=str(doc.trigger.get("kind")),
                trigger_source=str(doc.trigger.get("source")),
                trigger_message=nul_free(str(doc.trigger.get("message", ""))[:4000]),
                trigger_uid=item.trigger_uid or None,
                **(item.counts or doc.counts()),
                summary=nul_free(summary),
                fingerprint=nul_free(doc.fingerprint),
                **nul_free(sig_columns),
            )
            .returning(SnapshotRow.id)
        ).scalar_one()
        self._insert_parts(conn, snap_id, blobs)
        for ev in item.events:
            self.events.link(conn, ev, snap_id)
        doc.id = snap_id
        return int(snap_id), True, False

    def _amend(self, conn: Connection, item: SnapshotAmend, blobs: dict[str, bytes]) -> None:
        doc, snap_id = item.doc, item.snapshot_id
        old = conn.execute(select(SnapshotRow.summary).where(SnapshotRow.id == snap_id)).scalar_one_or_none()
        if old is None:
            raise NotFound(f"snapshot {snap_id} not found")
        doc.peers = self._peers(conn, doc)
        blobs["peers"] = pack(doc.peers)
        summary = dict(doc.summary)
        summary["trigger"] = old.get("trigger")
        if old.get("replays"):  # linked by a replay since the first commit
            summary["replays"] = old["replays"]
        if old.get("resumed"):  # a wedge's end linked since the first commit
            summary["resumed"] = old["resumed"]
        summary["amended_at"] = time.time()
        # the late evidence (the workers' tracebacks) is in now: it amends the stored signature
        sig_columns, summary["signature"] = crash_signature(doc, item.events, stored=old.get("signature"))
        conn.execute(
            update(SnapshotRow)
            .where(SnapshotRow.id == snap_id)
            .values(summary=nul_free(summary), fingerprint=nul_free(doc.fingerprint), **(item.counts or doc.counts()), **nul_free(sig_columns))
        )
        # delete + insert, not update: a part added since the first commit (peers) has no row
        conn.execute(delete(SnapshotPartRow).where(SnapshotPartRow.snapshot_id == snap_id))
        self._insert_parts(conn, snap_id, blobs)
        for ev in item.events:
            self.events.link(conn, ev, snap_id)

    def add_evidence(self, ev: dict[str, Any], snap_id: int) -> int:
        """Late evidence of a committed snapshot (it came after the amendment): its event row
        points at the snapshot, and the snapshot's signature is amended with it, in one
        transaction. Returns the rows linked."""
        with self.d.tx() as conn:
            linked = self.events.link(conn, ev, snap_id)
            row = conn.execute(select(SnapshotRow.summary, SnapshotRow.fingerprint).where(SnapshotRow.id == snap_id)).first()
            if row is None:
                return linked
            summary = dict(row.summary or {})
            header = SnapshotDoc(host=self.d.host, engine="", created_at=0.0, fault_ts=0.0, trigger=dict(summary.get("trigger") or {}))
            header.fingerprint = dict(row.fingerprint or {})
            sig_columns, signature = crash_signature(header, [ev], stored=summary.get("signature"))
            resumed = _resumed(ev)
            if signature != summary.get("signature") or resumed:
                summary["signature"] = signature
                if resumed:  # a wedge's end: when the engine moved again and how long it was stuck
                    summary["resumed"] = resumed
                conn.execute(update(SnapshotRow).where(SnapshotRow.id == snap_id).values(summary=nul_free(summary), **nul_free(sig_columns)))
            return linked

    @staticmethod
    def _insert_parts(conn: Connection, snap_id: int, blobs: dict[str, bytes]) -> None:
        conn.execute(insert(SnapshotPartRow), [{"snapshot_id": snap_id, "part": n, "encoding": ENCODING, "payload": b} for n, b in blobs.items()])

    def _peers(self, conn: Connection, doc: SnapshotDoc) -> list[dict[str, Any]]:
        """The other engines of the snapshot's P/D pair, with their last fingerprints."""
        known = {(p.get("host"), p.get("engine")): p for p in doc.peers}
        pair = doc.summary.get("pair")
        if pair:
            q = select(EngineRow.host, EngineRow.name, EngineRow.pair, EngineRow.fingerprint).where(EngineRow.pair == str(pair))
            for r in conn.execute(q):
                if (r.host, r.name) == (doc.host, doc.engine) or (r.host, r.name) in known:
                    continue
                fp = r.fingerprint or {}
                known[(r.host, r.name)] = {
                    "host": r.host,
                    "engine": r.name,
                    "pair": r.pair,
                    "role": fp.get("role") or fp.get("kv_role"),
                    "fingerprint": redact(fp),
                }
        return sorted(known.values(), key=lambda p: (str(p.get("host")), str(p.get("engine"))))

    def add_replay(self, snap_id: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Append a replay's outcome to the snapshot's ``summary.replays``; returns the list."""
        with self.d.tx() as conn:
            summary = conn.execute(select(SnapshotRow.summary).where(SnapshotRow.id == snap_id).with_for_update()).scalar_one_or_none()
            if summary is None:
                raise NotFound(f"snapshot {snap_id} not found")
            summary = dict(summary)
            replays = [*(summary.get("replays") or []), nul_free(redact(entry))]
            summary["replays"] = replays
            conn.execute(update(SnapshotRow).where(SnapshotRow.id == snap_id).values(summary=summary))
        return replays

    # -- reading --------------------------------------------------------------------------------
    def for_trigger(self, engine: str, trigger_uid: str, *, host: str | None = None) -> int | None:
        """The id of the snapshot stored for this trigger and engine, or None."""
        with self.d.tx() as conn:
            row = conn.execute(
                select(SnapshotRow.id).where(
                    SnapshotRow.host == (host or self.d.host), SnapshotRow.engine == engine, SnapshotRow.trigger_uid == trigger_uid
                )
            ).first()
        return None if row is None else int(row[0])

    def list(self, flt: SnapshotFilter, *, limit: int = 50, cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """Newest first, by (created_at, id); the cursor is the last row's key, so pages never
        repeat or skip a row even while snapshots are added."""
        q = select(*SUMMARY_COLUMNS)
        if flt.engine:
            q = q.where(SnapshotRow.engine == flt.engine)
        if flt.host:
            q = q.where(SnapshotRow.host == flt.host)
        if flt.trigger:
            q = q.where(SnapshotRow.trigger_kind == flt.trigger)
        if flt.incident_id is not None:
            q = q.where(SnapshotRow.incident_id == flt.incident_id)
        if flt.since is not None:
            q = q.where(SnapshotRow.created_at >= flt.since)
        if flt.until is not None:
            q = q.where(SnapshotRow.created_at < flt.until)
        if cursor:
            c_created, c_id = decode_cursor(cursor)
            q = q.where((SnapshotRow.created_at < c_created) | ((SnapshotRow.created_at == c_created) & (SnapshotRow.id < c_id)))
        q = q.order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc()).limit(limit + 1)
        with self.d.tx() as conn:
            rows = [dict(r._mapping) for r in conn.execute(q)]
        nxt = None
        if len(rows) > limit:
            rows = rows[:limit]
            nxt = encode_cursor(rows[-1]["created_at"], rows[-1]["id"])
        return rows, nxt

    def get_blobs(self, snap_id: int, *, parts: Sequence[str] = PARTS) -> tuple[SnapshotDoc, dict[str, bytes]]:
        """The snapshot's header (a doc without parts) and its parts' stored blobs, undecoded:
        the API splices them into its response without decompressing them."""
        with self.d.tx() as conn:
            row = conn.execute(select(SnapshotRow).where(SnapshotRow.id == snap_id)).mappings().first()
            if row is None:
                raise NotFound(f"snapshot {snap_id} not found")
            blobs = {
                p.part: bytes(p.payload)
                for p in conn.execute(
                    select(SnapshotPartRow.part, SnapshotPartRow.payload).where(
                        SnapshotPartRow.snapshot_id == snap_id, SnapshotPartRow.part.in_(list(parts))
                    )
                )
            }
            trigger_ev = conn.execute(select(EventRow.id).where(EventRow.snapshot_id == snap_id).order_by(EventRow.ts).limit(1)).first()
        summary = dict(row["summary"] or {})
        trigger = dict(summary.get("trigger") or {"kind": row["trigger_kind"], "source": row["trigger_source"], "message": row["trigger_message"]})
        if trigger_ev is not None:
            trigger.setdefault("event_id", trigger_ev[0])
        if row["gpu"] and not trigger.get("gpu"):  # stored before the trigger kept its GPU
            trigger["gpu"] = row["gpu"]
        doc = SnapshotDoc(
            host=row["host"],
            engine=row["engine"],
            created_at=row["created_at"],
            fault_ts=row["fault_ts"],
            trigger=trigger,
            summary=summary,
            fingerprint=dict(row["fingerprint"] or {}),
            id=row["id"],
            incident_id=row["incident_id"],
        )
        return doc, blobs

    def get(self, snap_id: int, *, parts: Sequence[str] = PARTS) -> SnapshotDoc:
        doc, blobs = self.get_blobs(snap_id, parts=parts)
        for name, blob in blobs.items():
            try:
                doc.set_part(name, blob if name == "requests" else unpack(blob))
            except (OSError, zlib.error, ValueError) as exc:
                raise StorageError(f"snapshot {snap_id} part {name} is unreadable: {exc}") from exc
        return doc

    def count(self) -> int:
        with self.d.tx() as conn:
            return int(conn.execute(select(func.count()).select_from(SnapshotRow)).scalar_one())


def _resumed(ev: dict[str, Any]) -> dict[str, Any] | None:
    """An ``engine_resumed`` event's note for its wedge's snapshot summary, else None."""
    if ev.get("kind") != "engine_resumed":
        return None
    data = ev.get("data") or {}
    return {"ts": data.get("resumed_ts", ev.get("ts")), "stuck_s": data.get("stuck_s"), "event_ts": ev.get("ts")}
