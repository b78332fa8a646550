"""The application context the HTTP handlers and the sidecar's ``/metrics`` see: the stages the
service wired, and read-only queries over them. The queries read ingest's state and must run
on the event loop (the handlers that use them are ``async``): nothing here is read from a
worker thread while the loop writes it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collector import __version__
from collector.alerting.router import Alerter
from collector.detectors.task import DetectorTask
from collector.ingest.hub import Hub
from collector.model import Event, EventKind, Severity, SourceStatus
from collector.settings import Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.sources.recorder import RecorderSource
from collector.sources.supervisor import SupervisedSource
from collector.storage.db import STATEMENT_TIMEOUT_MS, hang_watchdog
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter
from collector.tasks import TaskSet

# a configured engine that serves /metrics but has had no recorder for this long is reported
RECORDER_MISSING_AFTER_S = 60.0
RECORDER_FIX = (
    "install vllm-flight-recorder into the engine's Python environment (the stat-logger plugin "
    "loads by itself) and give engine and sidecar the same FLIGHTREC_RECORDER_DIR; add "
    "--scheduler-cls collector.vllm.RecordingScheduler for per-request rows"
)
RECORDER_UNJOINED_FIX = (
    "a recorder writes steps as {names}, which the sidecar could not join to this engine: it joins "
    "by the URL's port or the process listening on it on this host, so for a URL it cannot see that "
    "way (another container, a Service name) set FLIGHTREC_ENGINE_NAME={engine} in the engine's "
    "environment"
)


@dataclass
class AppContext:
    settings: Settings
    hub: Hub
    repo: Repository
    writer: BatchWriter
    committer: SnapshotCommitter
    detectors: DetectorTask
    loop: asyncio.AbstractEventLoop
    recorders: list[RecorderSource] = field(default_factory=list)
    supervised: list[SupervisedSource] = field(default_factory=list)
    tasks: TaskSet = field(default_factory=TaskSet)  # the stages' supervised tasks
    unsupported: list[SourceStatus] = field(default_factory=list)
    alerter: Alerter | None = None
    port_getter: Callable[[], int] | None = None
    snapshot_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    loop_lag_s: float = 0.0  # how late the loop's heartbeat last ran (the sidecar's own lateness)
    manual_wait_s: float = 5.0  # a manual POST waits this long for its commits before answering 202

    # -- queries ----------------------------------------------------------------------------
    @property
    def snapshots(self) -> SnapshotCommitter:  # the name the API and older callers use
        return self.committer

    def source_statuses(self) -> list[SourceStatus]:
        out = list(self.unsupported)
        for sup in self.supervised:
            out.extend(sup.statuses())
        return out

    def service_port(self) -> int:
        return self.port_getter() if self.port_getter is not None else self.settings.port

    def alert_stats(self) -> dict[str, int]:
        return self.alerter.stats() if self.alerter is not None else {}

    def recorder_missing(self) -> dict[str, str]:
        """Configured engines that answer /metrics but have no recorder: engine -> the fix."""
        now = time.time()
        if now - self.started_at < RECORDER_MISSING_AFTER_S:
            return {}
        unjoined = sorted(n for n, st in self.hub.engines.items() if not st.configured and st.steps_received)
        out = {}
        for name, st in self.hub.engines.items():
            # a joined recorder's fingerprint arrives before any step: an idle engine has one
            if not st.configured or st.steps_received or st.fingerprint or st.last_scrape_ok is None:
                continue
            out[name] = RECORDER_UNJOINED_FIX.format(names=", ".join(unjoined[:4]), engine=name) if unjoined else RECORDER_FIX
        return out

    def ingest_figures(self) -> dict[str, Any]:
        rec: dict[str, Any] = {}
        for r in self.recorders:
            for k, v in r.figures().items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    rec[k] = (rec.get(k) or 0) + v
                elif isinstance(v, list):
                    rec[k] = sorted(set(rec.get(k, [])) | set(v))
                elif v is None:
                    rec.setdefault(k, None)
        w = self.writer
        return {
            "recorder": rec,
            "steps_received": sum(st.steps_received for st in self.hub.engines.values()),
            "request_rows_received": sum(st.requests_received for st in self.hub.engines.values()),
            "steps_written": w.steps_written,
            "rows_pending": w.pending_rows,
            "rows_dropped": w.dropped,
            "rows_rejected": w.rejected,
            "ingest_dropped": self.hub.dropped,
            "snapshot_backlog": self.committer.backlog,
            "loop_lag_s": round(self.loop_lag_s, 4),
        }

    def behind(self) -> bool:
        """The sidecar itself is late: its loop ran late, or a ring's newest record is old while
        its writer is alive (cheap: for the detector task's every tick)."""
        if self.loop_lag_s > 1.0:
            return True
        return any((r.figures().get("lag_s") or 0.0) > 2.0 for r in self.recorders)

    def database_wait_s(self) -> float | None:
        """How long the oldest database statement in flight has waited (None: none, or SQLite)."""
        dog = hang_watchdog(self.repo.db)
        return None if dog is None else dog.oldest_wait_s()

    def database_up(self) -> bool | None:
        """False when the last write failed or a statement waits past the server's own timeout
        (a live server answers or cancels it by then: this one is hung); None before any write."""
        wait = self.database_wait_s()
        if wait is not None and wait > STATEMENT_TIMEOUT_MS / 1000:
            return False
        if self._cut_since_last_write():
            return False
        return self.writer.db_up

    def _cut_since_last_write(self) -> bool:
        """The watchdog cut a statement nobody answered, and no write has succeeded since (the
        writer itself may still be waiting on a connection that has not failed yet)."""
        dog = hang_watchdog(self.repo.db)
        return dog is not None and dog.last_shut is not None and (self.writer.last_ok or 0.0) < dog.last_shut

    def health(self) -> dict[str, Any]:
        statuses = [dataclasses.asdict(s) for s in self.source_statuses()]
        figures = self.ingest_figures()
        behind = figures["loop_lag_s"] > 1.0 or (figures["recorder"].get("lag_s") or 0) > 5.0
        missing = self.recorder_missing()
        tasks = [dataclasses.asdict(t) for t in self.tasks.statuses()]
        held_in_memory = bool(self.committer.spool_error) and self.committer.backlog > 0
        db_up, wait = self.database_up(), self.database_wait_s()
        hung = wait is not None and wait > STATEMENT_TIMEOUT_MS / 1000
        degraded = (
            db_up is False
            or behind
            or bool(missing)
            or bool(self.tasks.failing())
            or held_in_memory
            or any(s["supported"] and not s["up"] for s in statuses)
        )
        return {
            "status": "degraded" if degraded else "ok",
            "version": __version__,
            "database_up": db_up,
            "database_error": (
                f"no answer for {wait:.0f}s: the database is hung"
                if hung
                else self.writer.last_error
                or ("a statement had no answer: its connection was cut; no write since" if self._cut_since_last_write() else "")
            )
            or None,
            "spool_error": self.committer.spool_error or None,
            "sources": statuses,
            "tasks": tasks,
            "snapshots_committed": self.committer.committed,
            "snapshots_waiting": self.committer.backlog,
            "ingest": figures,
            "behind": behind,
            "recorder_missing": missing,
        }

    def engines_live(self) -> list[dict[str, Any]]:
        missing = self.recorder_missing()
        out = []
        for name, st in sorted(self.hub.engines.items()):
            last = st.ring.last()
            out.append(
                {
                    "name": name,
                    "host": self.hub.host,
                    "url": st.url,
                    "pair": st.pair,
                    "up": st.up,
                    "configured": st.configured,
                    "last_seen": st.last_seen,
                    "steps_in_ring": len(st.ring),
                    "steps_received": st.steps_received,
                    "request_rows_received": st.requests_received,
                    "last_step": last.step if last else None,
                    "running": last.running if last else None,
                    "waiting": last.waiting if last else None,
                    "kv_cache_usage": last.kv_cache_usage if last else None,
                    "last_scrape": ({"ts": st.scrapes[-1].ts, "values": dict(st.scrapes[-1].values)} if st.scrapes else None),
                    "recorder": "missing" if name in missing else ("recording" if st.steps_received or st.fingerprint else "none"),
                    "recorder_fix": missing.get(name),
                    "vllm_version": st.fingerprint.get("vllm_version"),
                    "fingerprint": dict(st.fingerprint),
                }
            )
        return out

    def detector_states(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(s) for s in self.detectors.states()]

    async def manual_snapshot(self, engine: str | None, reason: str, *, wait_s: float | None = None) -> list[dict[str, Any]]:
        """Take a manual snapshot of one engine (or all); wait up to ``wait_s`` for the commits.
        Each answer has the snapshot id, or null with the state when not committed yet."""
        ev = Event(
            kind=EventKind.MANUAL, ts=self.hub.clock(), source="api", message=reason or "manual snapshot", severity=Severity.INFO, engine=engine
        )
        if engine is None:
            ev.engine = None
            opens = [self.committer.snapshot_due(name, ev) for name in sorted(self.hub.engines)]
            self.hub.emit(ev)  # stored and routed like any event (the policy sees it has no engine)
        else:
            self.hub.emit(ev)
            opens = self.committer.opens_for(ev)
        futures = [o.committed for o in opens if o.committed is not None]
        if futures:
            await asyncio.wait(futures, timeout=self.manual_wait_s if wait_s is None else wait_s)
        return [
            {
                "engine": o.engine,
                "id": o.snapshot_id,
                "status": "committed" if o.snapshot_id else ("spooled" if o.spool_path else "pending"),
                "error": o.error or None,
            }
            for o in opens
        ]
