"""Commits snapshots: at once on the first trigger, amended once after the settle time.

A snapshot is spooled to a file before the database sees it, so a database that is down (or a
sidecar stopped mid-commit) loses nothing: spooled snapshots are committed when it is back,
including after a restart. Alerts about a snapshot are only sent after its commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.ingest.hub import Hub
from collector.model import Event
from collector.snapshot.document import SnapshotDoc, export_gzip
from collector.storage.db import StorageError
from collector.storage.repo import Repository, pack_parts
from collector.storage.writer import event_row

log = logging.getLogger(__name__)


@dataclass
class _Open:
    engine: str
    trigger: Event
    snapshot_id: int | None
    until: float
    late: list[Event]
    amended: bool = False


class SnapshotManager:
    def __init__(
        self,
        hub: Hub,
        repo: Repository,
        *,
        spool_dir: Path,
        settle_s: float,
        window_s: float,
        on_committed: Callable[[SnapshotDoc, Event], None] | None = None,
        before_freeze: Callable[[], object] | None = None,
    ) -> None:
        self.hub = hub
        # Reads what the in-engine recorder published but the sidecar has not polled yet, so
        # the first commit already ends at the engine's last step (the service passes the
        # recorder source's poll; the amendment would otherwise bring those steps a second later).
        self.before_freeze = before_freeze
        self.repo = repo
        self.spool_dir = Path(spool_dir)
        self.settle_s = settle_s
        self.window_s = window_s
        self.on_committed = on_committed
        self._open: dict[str, _Open] = {}
        self._queue: asyncio.Queue[tuple[str, Event]] = asyncio.Queue()
        self.committed = 0
        self.commit_latency: list[float] = []  # seconds, fault event seen -> committed
        hub.snapshot_sink = self

    def snapshots_for(self, ev: Event) -> dict[str, int | None]:
        """The open snapshots this event started or joined: engine -> id (None until committed)."""
        return {name: cur.snapshot_id for name, cur in self._open.items() if ev is cur.trigger or ev in cur.late}

    # Called by the hub from the event loop thread.
    def snapshot_due(self, engine: str, trigger: Event) -> None:
        now = self.hub.clock()
        cur = self._open.get(engine)
        if cur is not None and now < cur.until:
            cur.late.append(trigger)  # same fault, another witness: no second snapshot
            return
        self._open[engine] = _Open(engine, trigger, None, now + self.window_s, [])
        self._queue.put_nowait((engine, trigger))

    async def run(self) -> None:
        await self._recover_spool()
        while True:
            engine, trigger = await self._queue.get()
            seen_at = time.time()
            if self.before_freeze is not None:
                try:
                    self.before_freeze()
                except Exception:  # a late read must never cost the snapshot
                    log.exception("reading the recorder before a freeze failed")
            doc = self.hub.freeze(engine, trigger)
            # encoded once, off the loop: the same blobs make the spool file and the rows
            blobs = await asyncio.to_thread(pack_parts, doc)
            sid = await self._commit(doc, trigger, blobs)
            if sid is None:
                continue
            self.commit_latency.append(time.time() - seen_at)
            self.commit_latency = self.commit_latency[-1000:]
            cur = self._open.get(engine)
            if cur is not None and cur.trigger is trigger:
                cur.snapshot_id = sid
            if self.on_committed is not None:
                try:
                    self.on_committed(doc, trigger)
                except Exception:
                    log.exception("snapshot listener failed")
            asyncio.get_running_loop().call_later(
                self.settle_s, lambda e=engine, t=trigger: asyncio.ensure_future(self._amend(e, t))
            )

    async def _commit(self, doc: SnapshotDoc, trigger: Event, blobs: dict[str, bytes]) -> int | None:
        spooled = await asyncio.to_thread(self._spool, doc, blobs)
        key = f"{trigger.kind.value}:{int(trigger.ts)}"
        delay = 0.5
        while True:
            try:
                sid, _ = await asyncio.to_thread(
                    self.repo.store_snapshot, doc, incident_window_s=self.window_s, incident_key=key, blobs=blobs
                )
                # The batching writer stores every event once; the trigger's row is linked
                # to its snapshot (now if written, else the writer carries the link).
                trigger.data["snapshot_id"] = sid
                await asyncio.to_thread(self.repo.link_event, event_row(trigger), sid)
                break
            except StorageError as exc:
                log.error("snapshot of %s not committed yet (%s); spooled at %s, retrying", doc.engine, exc, spooled)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        if spooled is not None:
            spooled.unlink(missing_ok=True)
        self.committed += 1
        log.warning("snapshot %d of %s committed (trigger %s: %s)", sid, doc.engine, trigger.kind.value, trigger.message[:120])
        return sid

    async def _amend(self, engine: str, trigger: Event) -> None:
        cur = self._open.get(engine)
        if cur is None or cur.trigger is not trigger or cur.snapshot_id is None or cur.amended:
            return
        cur.amended = True
        doc = self.hub.freeze(engine, trigger)
        if cur.snapshot_id is not None:  # a write that raced the first link, or a late witness
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(self.repo.link_event, event_row(trigger), cur.snapshot_id)
        try:
            await asyncio.to_thread(self.repo.amend_snapshot, cur.snapshot_id, doc)
        except StorageError as exc:
            log.error("could not amend snapshot %s: %s", cur.snapshot_id, exc)

    def _spool(self, doc: SnapshotDoc, blobs: dict[str, bytes] | None = None) -> Path | None:
        try:
            blobs = blobs if blobs is not None else pack_parts(doc)
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            path = self.spool_dir / f"snapshot-{doc.created_at:.6f}-{doc.engine.replace('/', '_')}.json.gz"
            path.write_bytes(export_gzip(doc.header(), blobs))  # the export file: spliced, not re-encoded
            return path
        except OSError as exc:
            log.error("cannot spool snapshot: %s", exc)
            return None

    async def _recover_spool(self) -> None:
        if not self.spool_dir.is_dir():
            return
        for path in sorted(self.spool_dir.glob("snapshot-*.json.gz")):
            try:
                data: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
                doc = SnapshotDoc.from_export({k: v for k, v in data.items() if k not in ("id", "incident_id")})
            except (OSError, ValueError, TypeError) as exc:
                log.error("spooled snapshot %s unreadable (%s); left in place", path, exc)
                continue
            key = f"{doc.trigger.get('kind')}:{int(doc.fault_ts)}"
            while True:
                try:
                    await asyncio.to_thread(self.repo.store_snapshot, doc, incident_window_s=self.window_s, incident_key=key)
                    break
                except StorageError as exc:
                    log.error("spooled snapshot %s not committed yet: %s", path.name, exc)
                    await asyncio.sleep(5)
            path.unlink(missing_ok=True)
            log.warning("committed spooled snapshot %s", path.name)
