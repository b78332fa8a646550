"""Reads and writes the API, the CLI and the sidecar need. Driver errors become StorageError."""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from collector.redact import redact
from collector.snapshot.document import ENCODING, PARTS, SnapshotDoc, pack, unpack
from collector.storage.db import StorageError, translate
from collector.storage.models import (
    EngineRow,
    EngineScrapeRow,
    EngineStepRow,
    EventRow,
    GpuRow,
    GpuSampleRow,
    IncidentRow,
    SnapshotPartRow,
    SnapshotRow,
)


class NotFound(StorageError):
    pass


class BadCursor(ValueError):
    pass


def encode_cursor(created_at: float, id_: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, id_]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, id_ = json.loads(raw)
        return float(created), int(id_)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise BadCursor("cursor is not one this API returned") from exc


@dataclass
class SnapshotFilter:
    engine: str | None = None
    host: str | None = None
    trigger: str | None = None
    incident_id: int | None = None
    since: float | None = None
    until: float | None = None


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
SUMMARY_COLUMNS = (
    SnapshotRow.id,
    SnapshotRow.incident_id,
    SnapshotRow.host,
    SnapshotRow.engine,
    SnapshotRow.created_at,
    SnapshotRow.fault_ts,
    SnapshotRow.trigger_kind,
    SnapshotRow.trigger_source,
    SnapshotRow.trigger_message,
    SnapshotRow.step_count,
    SnapshotRow.request_rows,
    SnapshotRow.first_step,
    SnapshotRow.last_step,
    SnapshotRow.summary,
)


def pack_parts(doc: SnapshotDoc) -> dict[str, bytes]:
    """The stored form of a snapshot's parts (peers are added at commit). Encode once: the
    same blobs make the spool file and the database rows. The request rows are stored as the
    recorder wrote them (``RequestTable.stored_blob``), decoded when read."""
    return {name: doc.requests.stored_blob() if name == "requests" else pack(doc.part(name)) for name in PARTS if name != "peers"}


def nul_free(value: Any) -> Any:
    """Postgres text and JSONB cannot hold NUL: a NUL byte in a log line or a reason would make
    the whole batch fail forever. Replaced, everywhere a string is kept in a column."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {nul_free(k): nul_free(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nul_free(v) for v in value]
    return value


class Repository:
    def __init__(self, db: Engine, *, host: str) -> None:
        self.db = db  # the SQLAlchemy engine (named so beside vLLM's engines)
        self.host = host
        self._engine_ids: dict[str, int] = {}
        self._gpu_ids: dict[str, int] = {}
        self._step_sql: dict[str, str] = {}

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        try:
            with self.db.begin() as conn:
                yield conn
        except NotFound:
            raise
        except SQLAlchemyError as exc:
            # ids learnt inside a transaction that rolled back may not exist: forget them all
            self._engine_ids.clear()
            self._gpu_ids.clear()
            raise translate(exc) from exc

    @property
    def dialect(self) -> str:
        return self.db.dialect.name

    # -- engines and GPUs -------------------------------------------------------------------
    def engine_id(self, conn: Connection, name: str, *, url: str | None = None, pair: str | None = None) -> int:
        cached = self._engine_ids.get(name)
        if cached is not None:
            return cached
        row = conn.execute(select(EngineRow.id).where(EngineRow.host == self.host, EngineRow.name == name)).first()
        if row is None:
            now = time.time()
            try:
                with conn.begin_nested():
                    new_id = conn.execute(
                        insert(EngineRow)
                        .values(host=self.host, name=name, url=url, pair=pair, state="unknown", first_seen=now, last_seen=now)
                        .returning(EngineRow.id)
                    ).scalar_one()
            except IntegrityError:
                new_id = conn.execute(select(EngineRow.id).where(EngineRow.host == self.host, EngineRow.name == name)).scalar_one()
        else:
            new_id = row[0]
        self._engine_ids[name] = new_id
        return new_id

    def register_engine(self, name: str, *, url: str | None, pair: str | None) -> int:
        with self._tx() as conn:
            eid = self.engine_id(conn, name, url=url, pair=pair)
            conn.execute(update(EngineRow).where(EngineRow.id == eid).values(url=url, pair=pair))
            return eid

    def update_engine(self, name: str, **values: Any) -> None:
        with self._tx() as conn:
            eid = self.engine_id(conn, name)
            conn.execute(update(EngineRow).where(EngineRow.id == eid).values(**nul_free(values)))

    def gpu_id(self, conn: Connection, gpu: str, *, index: int, bus_id: str | None, name: str | None) -> int:
        cached = self._gpu_ids.get(gpu)
        if cached is not None:
            return cached
        row = conn.execute(select(GpuRow.id).where(GpuRow.host == self.host, GpuRow.gpu == gpu)).first()
        if row is None:
            now = time.time()
            new_id = conn.execute(
                insert(GpuRow)
                .values(host=self.host, gpu=gpu, index=index, bus_id=bus_id, name=name, first_seen=now, last_seen=now)
                .returning(GpuRow.id)
            ).scalar_one()
        else:
            new_id = row[0]
        self._gpu_ids[gpu] = new_id
        return new_id

    # -- continuous series ------------------------------------------------------------------
    def write_batch(
        self,
        steps: Sequence[dict[str, Any]],
        gpu_samples: Sequence[dict[str, Any]],
        events: Sequence[dict[str, Any]],
        seen: dict[str, float] | None = None,
        *,
        scrapes: Sequence[dict[str, Any]] = (),
        step_tuples: Sequence[tuple[Any, ...]] = (),
    ) -> None:
        """One transaction for a batch of the continuous series (the writer's flush). A step
        already stored (a ring read again after a restart) is skipped, not duplicated.

        ``step_tuples``: steps as ``STEP_TUPLE`` tuples (the engine's name first), the writer's
        form: one driver-level ``executemany`` over tuples, with no per-row dict or binding."""
        with self._tx() as conn:
            if step_tuples:
                self._insert_step_tuples(conn, step_tuples)
            if steps:
                rows = []
                for s in steps:
                    s = dict(s)
                    s["engine_id"] = self.engine_id(conn, s.pop("engine"))
                    rows.append(s)
                conn.execute(self._insert_ignore(EngineStepRow, ["engine_id", "run", "step"]), rows)
            if scrapes:
                rows = []
                for s in scrapes:
                    s = dict(s)
                    s["engine_id"] = self.engine_id(conn, s.pop("engine"))
                    s["values"] = nul_free(s["values"])
                    rows.append(s)
                conn.execute(insert(EngineScrapeRow), rows)
            if gpu_samples:
                rows = []
                for g in gpu_samples:
                    g = dict(g)
                    g["gpu_id"] = self.gpu_id(conn, g.pop("gpu"), index=g.pop("index"), bus_id=g.pop("bus_id"), name=g.pop("name"))
                    rows.append(g)
                conn.execute(insert(GpuSampleRow), rows)
            if events:
                # insert-or-ignore on (host, uid): a snapshot's commit may have stored the row first
                conn.execute(self._insert_ignore(EventRow, ["host", "uid"]), [nul_free(dict(e, host=self.host)) for e in events])
            for name, ts in (seen or {}).items():
                eid = self.engine_id(conn, name)
                conn.execute(update(EngineRow).where(EngineRow.id == eid).values(last_seen=ts))

    def _insert_step_tuples(self, conn: Connection, tuples: Sequence[tuple[Any, ...]]) -> None:
        ids: dict[str, int] = {}
        for name in {t[0] for t in tuples}:
            ids[name] = self.engine_id(conn, name)
        rows = [(ids[t[0]], *t[1:]) for t in tuples]
        sql = self._step_sql.get(self.dialect)
        if sql is None:
            cols = ", ".join(("engine_id", *STEP_TUPLE[1:]))
            mark = "%s" if self.db.dialect.paramstyle in ("format", "pyformat") else "?"
            marks = ", ".join([mark] * len(STEP_TUPLE))
            verb = "INSERT INTO" if self.dialect == "postgresql" else "INSERT OR IGNORE INTO"
            tail = " ON CONFLICT (engine_id, run, step) DO NOTHING" if self.dialect == "postgresql" else ""
            sql = self._step_sql[self.dialect] = f"{verb} engine_steps ({cols}) VALUES ({marks}){tail}"
        conn.exec_driver_sql(sql, rows)

    def _insert_ignore(self, table: Any, keys: list[str]) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table).on_conflict_do_nothing(index_elements=keys)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing(index_elements=keys)

    def prune(self, *, steps_before: float, gpu_before: float, events_before: float, snapshots_before: float | None) -> dict[str, int]:
        counts = {}
        with self._tx() as conn:
            counts["engine_steps"] = conn.execute(delete(EngineStepRow).where(EngineStepRow.ts < steps_before)).rowcount
            counts["engine_scrapes"] = conn.execute(delete(EngineScrapeRow).where(EngineScrapeRow.ts < steps_before)).rowcount
            counts["gpu_samples"] = conn.execute(delete(GpuSampleRow).where(GpuSampleRow.ts < gpu_before)).rowcount
            counts["events"] = conn.execute(delete(EventRow).where(EventRow.ts < events_before, EventRow.snapshot_id.is_(None))).rowcount
            if snapshots_before is not None:
                old = select(SnapshotRow.id).where(SnapshotRow.created_at < snapshots_before)
                conn.execute(delete(SnapshotPartRow).where(SnapshotPartRow.snapshot_id.in_(old)))
                counts["snapshots"] = conn.execute(delete(SnapshotRow).where(SnapshotRow.created_at < snapshots_before)).rowcount
        return counts

    # -- snapshots and incidents -----------------------------------------------------------
    def store_snapshot(
        self,
        doc: SnapshotDoc,
        *,
        incident_window_s: float,
        incident_key: str,
        blobs: dict[str, bytes] | None = None,
        counts: dict[str, Any] | None = None,
        trigger_uid: str | None = None,
        trigger_event: dict[str, Any] | None = None,
    ) -> tuple[int, int]:
        """Commit a snapshot and file it under an incident; returns (snapshot id, incident id).
        ``commit_snapshot`` is the same, and also says whether it was stored by this call."""
        sid, iid, _ = self.commit_snapshot(
            doc,
            incident_window_s=incident_window_s,
            incident_key=incident_key,
            blobs=blobs,
            counts=counts,
            trigger_uid=trigger_uid,
            trigger_event=trigger_event,
        )
        return sid, iid

    def commit_snapshot(
        self,
        doc: SnapshotDoc,
        *,
        incident_window_s: float,
        incident_key: str,
        blobs: dict[str, bytes] | None = None,
        counts: dict[str, Any] | None = None,
        trigger_uid: str | None = None,
        trigger_event: dict[str, Any] | None = None,
    ) -> tuple[int, int, bool]:
        """Commit a snapshot and file it under an incident: (snapshot id, incident id, stored
        now), the last False when its trigger's snapshot was already stored.

        ``trigger_uid`` makes the commit idempotent: a snapshot of this engine already stored
        for that trigger (a retake after a kill that came after the commit) is returned, not
        stored again. ``trigger_event`` (an ``event_row``) is stored or linked in the same
        transaction, so the snapshot and its trigger's event row are committed together.

        A snapshot joins the incident whose faults lie within ``incident_window_s`` of its own
        (the nearest one, so a spooled snapshot committed late still finds its fault's
        incident): TP workers failing at one step, the P and D engines of a pair, several hosts
        writing to one Postgres. The fingerprints of the engine's pair peers are stored with it,
        so the triage checklist (NCCL_NET_PLUGIN on both engines) is answerable from one
        snapshot.
        """
        blobs = dict(blobs) if blobs is not None else pack_parts(doc)  # compressed outside the transaction
        with self._tx() as conn:
            if self.dialect == "postgresql":
                # Several sidecars may file the same fault at once: one incident, not two.
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": 0x46_4C_52_45_43})
            if trigger_uid:
                have = conn.execute(
                    select(SnapshotRow.id, SnapshotRow.incident_id).where(
                        SnapshotRow.host == doc.host, SnapshotRow.engine == doc.engine, SnapshotRow.trigger_uid == trigger_uid
                    )
                ).first()
                if have is not None:
                    if trigger_event is not None:
                        self._store_event(conn, trigger_event, have.id)
                    doc.id, doc.incident_id = have.id, have.incident_id
                    return int(have.id), int(have.incident_id or 0), False
            doc.peers = self._peers(conn, doc)
            blobs["peers"] = pack(doc.peers)
            incident_id = self._incident_for(conn, doc, incident_window_s, incident_key)
            summary = dict(doc.summary)
            summary["trigger"] = {k: doc.trigger.get(k) for k in ("kind", "source", "message", "xid", "process", "severity")}
            snap_id = conn.execute(
                insert(SnapshotRow)
                .values(
                    incident_id=incident_id,
                    host=doc.host,
                    engine=doc.engine,
                    created_at=doc.created_at,
                    fault_ts=doc.fault_ts,
                    trigger_kind=str(doc.trigger.get("kind")),
                    trigger_source=str(doc.trigger.get("source")),
                    trigger_message=nul_free(str(doc.trigger.get("message", ""))[:4000]),
                    trigger_uid=trigger_uid or None,
                    **(counts or doc.counts()),
                    summary=nul_free(summary),
                    fingerprint=nul_free(doc.fingerprint),
                )
                .returning(SnapshotRow.id)
            ).scalar_one()
            conn.execute(
                insert(SnapshotPartRow),
                [{"snapshot_id": snap_id, "part": n, "encoding": ENCODING, "payload": b} for n, b in blobs.items()],
            )
            conn.execute(update(IncidentRow).where(IncidentRow.id == incident_id).values(snapshot_count=IncidentRow.snapshot_count + 1))
            if trigger_event is not None:
                self._store_event(conn, trigger_event, snap_id)
        doc.id, doc.incident_id = snap_id, incident_id
        return snap_id, incident_id, True

    def _store_event(self, conn: Connection, ev: dict[str, Any], snapshot_id: int) -> None:
        """The event's row, pointing at the snapshot: inserted when the writer has not written it
        (yet, or ever: a sidecar killed before its flush), else linked. One row per event id."""
        row = nul_free(dict(ev, host=self.host, snapshot_id=snapshot_id))
        if not row.get("uid"):
            conn.execute(insert(EventRow).values(**row))
            return
        conn.execute(self._insert_ignore(EventRow, ["host", "uid"]).values(**row))
        conn.execute(
            update(EventRow)
            .where(EventRow.host == self.host, EventRow.uid == row["uid"], EventRow.snapshot_id.is_(None))
            .values(snapshot_id=snapshot_id)
        )

    def store_event(self, ev: dict[str, Any], snapshot_id: int) -> None:
        """``_store_event`` in its own transaction (a retaken trigger whose snapshot is stored)."""
        with self._tx() as conn:
            self._store_event(conn, ev, snapshot_id)

    def snapshot_for_trigger(self, engine: str, trigger_uid: str, *, host: str | None = None) -> int | None:
        """The id of the snapshot stored for this trigger and engine, or None."""
        with self._tx() as conn:
            row = conn.execute(
                select(SnapshotRow.id).where(
                    SnapshotRow.host == (host or self.host), SnapshotRow.engine == engine, SnapshotRow.trigger_uid == trigger_uid
                )
            ).first()
        return None if row is None else int(row[0])

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

    def _incident_for(self, conn: Connection, doc: SnapshotDoc, window: float, key: str) -> int:
        t = doc.fault_ts
        row = (
            conn.execute(
                select(IncidentRow)
                .where(IncidentRow.opened_at <= t + window, IncidentRow.updated_at >= t - window)
                .order_by(IncidentRow.updated_at.desc())
                .limit(8)
            )
            .mappings()
            .all()
        )
        if row:
            # the incident nearest in time: a late-committed snapshot must not join a newer one
            best = min(row, key=lambda r: 0.0 if r["opened_at"] <= t <= r["updated_at"] else min(abs(t - r["opened_at"]), abs(t - r["updated_at"])))
            hosts = sorted(set(best["hosts"] or []) | {doc.host})
            engines = sorted(set(best["engines"] or []) | {f"{doc.host}/{doc.engine}"})
            conn.execute(
                update(IncidentRow)
                .where(IncidentRow.id == best["id"])
                .values(updated_at=max(best["updated_at"], t), opened_at=min(best["opened_at"], t), hosts=hosts, engines=engines)
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
                    snapshot_count=0,
                )
                .returning(IncidentRow.id)
            ).scalar_one()
        )

    def list_snapshots(self, flt: SnapshotFilter, *, limit: int = 50, cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
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
        with self._tx() as conn:
            rows = [dict(r._mapping) for r in conn.execute(q)]
        nxt = None
        if len(rows) > limit:
            rows = rows[:limit]
            nxt = encode_cursor(rows[-1]["created_at"], rows[-1]["id"])
        return rows, nxt

    def get_snapshot_blobs(self, snap_id: int, *, parts: Sequence[str] = PARTS) -> tuple[SnapshotDoc, dict[str, bytes]]:
        """The snapshot's header (a doc without parts) and its parts' stored blobs, undecoded:
        the API splices them into its response without decompressing them."""
        with self._tx() as conn:
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

    def get_snapshot(self, snap_id: int, *, parts: Sequence[str] = PARTS) -> SnapshotDoc:
        doc, blobs = self.get_snapshot_blobs(snap_id, parts=parts)
        for name, blob in blobs.items():
            try:
                doc.set_part(name, blob if name == "requests" else unpack(blob))
            except (OSError, zlib.error, ValueError) as exc:
                raise StorageError(f"snapshot {snap_id} part {name} is unreadable: {exc}") from exc
        return doc

    def add_replay(self, snap_id: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Append a replay's outcome to the snapshot's ``summary.replays``; returns the list."""
        with self._tx() as conn:
            summary = conn.execute(select(SnapshotRow.summary).where(SnapshotRow.id == snap_id).with_for_update()).scalar_one_or_none()
            if summary is None:
                raise NotFound(f"snapshot {snap_id} not found")
            summary = dict(summary)
            replays = [*(summary.get("replays") or []), nul_free(redact(entry))]
            summary["replays"] = replays
            conn.execute(update(SnapshotRow).where(SnapshotRow.id == snap_id).values(summary=summary))
        return replays

    def amend_snapshot(self, snap_id: int, doc: SnapshotDoc, *, blobs: dict[str, bytes] | None = None, counts: dict[str, Any] | None = None) -> None:
        """Replace a snapshot's parts and summary with a later freeze of the same fault."""
        blobs = dict(blobs) if blobs is not None else pack_parts(doc)
        with self._tx() as conn:
            old = conn.execute(select(SnapshotRow.summary).where(SnapshotRow.id == snap_id)).scalar_one_or_none()
            if old is None:
                raise NotFound(f"snapshot {snap_id} not found")
            doc.peers = self._peers(conn, doc)
            blobs["peers"] = pack(doc.peers)
            summary = dict(doc.summary)
            summary["trigger"] = old.get("trigger")
            if old.get("replays"):  # linked by a replay since the first commit
                summary["replays"] = old["replays"]
            summary["amended_at"] = time.time()
            conn.execute(
                update(SnapshotRow)
                .where(SnapshotRow.id == snap_id)
                .values(
                    summary=nul_free(summary),
                    fingerprint=nul_free(doc.fingerprint),
                    **(counts or doc.counts()),
                )
            )
            # delete + insert, not update: a part added since the first commit (peers) has no row
            conn.execute(delete(SnapshotPartRow).where(SnapshotPartRow.snapshot_id == snap_id))
            conn.execute(
                insert(SnapshotPartRow),
                [{"snapshot_id": snap_id, "part": n, "encoding": ENCODING, "payload": b} for n, b in blobs.items()],
            )

    def snapshot_count(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(select(func.count()).select_from(SnapshotRow)).scalar_one())

    def list_incidents(self, *, limit: int = 50, before_id: int | None = None) -> list[dict[str, Any]]:
        q = select(IncidentRow).order_by(IncidentRow.id.desc()).limit(limit)
        if before_id is not None:
            q = q.where(IncidentRow.id < before_id)
        with self._tx() as conn:
            return [_incident_dict(r) for r in conn.execute(q).mappings()]

    def get_incident(self, incident_id: int) -> dict[str, Any]:
        with self._tx() as conn:
            row = conn.execute(select(IncidentRow).where(IncidentRow.id == incident_id)).mappings().first()
            if row is None:
                raise NotFound(f"incident {incident_id} not found")
            out = _incident_dict(row)
            out["snapshots"] = [
                dict(r._mapping)
                for r in conn.execute(select(*SUMMARY_COLUMNS).where(SnapshotRow.incident_id == incident_id).order_by(SnapshotRow.id))
            ]
        return out

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
        with self._tx() as conn:
            return [_row_dict(r) for r in conn.execute(q).mappings()]

    def link_event(self, ev: dict[str, Any], snapshot_id: int) -> int:
        """Point the stored row of an event (written by the batching writer) at its snapshot,
        and refresh its data (a second witness merged into it after the row was written);
        returns the rows updated (0 while the writer has not written it yet). Events are
        found by the id they got at ingest."""
        if ev.get("uid"):
            where = [EventRow.host == self.host, EventRow.uid == ev["uid"]]
        else:  # a row written before events had ids
            where = [EventRow.host == self.host, EventRow.ts == ev["ts"], EventRow.kind == ev["kind"], EventRow.source == ev["source"]]
        with self._tx() as conn:
            return int(
                conn.execute(
                    update(EventRow)
                    .where(*where, EventRow.snapshot_id.is_(None) | (EventRow.snapshot_id == snapshot_id))
                    .values(snapshot_id=snapshot_id, data=nul_free(ev["data"]))
                ).rowcount
            )

    def insert_event(self, ev: dict[str, Any], *, snapshot_id: int | None = None) -> int:
        with self._tx() as conn:
            return int(
                conn.execute(
                    insert(EventRow).values(**nul_free(dict(ev)), host=self.host, snapshot_id=snapshot_id).returning(EventRow.id)
                ).scalar_one()
            )

    def list_engines(self) -> list[dict[str, Any]]:
        with self._tx() as conn:
            return [_row_dict(r) for r in conn.execute(select(EngineRow).order_by(EngineRow.host, EngineRow.name)).mappings()]

    def list_gpus(self) -> list[dict[str, Any]]:
        with self._tx() as conn:
            return [_row_dict(r) for r in conn.execute(select(GpuRow).order_by(GpuRow.host, GpuRow.index)).mappings()]

    def recent_scrapes(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        with self._tx() as conn:
            q = (
                select(EngineScrapeRow)
                .join(EngineRow, EngineRow.id == EngineScrapeRow.engine_id)
                .where(EngineRow.name == engine, EngineRow.host == self.host, EngineScrapeRow.ts >= since)
                .order_by(EngineScrapeRow.ts)
            )
            return [_row_dict(r) for r in conn.execute(q).mappings()]

    def recent_steps(self, engine: str, *, since: float) -> list[dict[str, Any]]:
        with self._tx() as conn:
            q = (
                select(EngineStepRow)
                .join(EngineRow, EngineRow.id == EngineStepRow.engine_id)
                .where(EngineRow.name == engine, EngineRow.host == self.host, EngineStepRow.ts >= since)
                .order_by(EngineStepRow.ts)
            )
            return [_row_dict(r) for r in conn.execute(q).mappings()]


def _row_dict(row: Any) -> dict[str, Any]:
    return dict(row)


def _incident_dict(row: Any) -> dict[str, Any]:
    return dict(row)
