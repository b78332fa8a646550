"""Internal: The application context the HTTP handlers and the sidecar's ``/metrics`` see: the stages the
service wired (each given at construction), and read-only queries over them. The queries read
ingest's view and must run on the event loop (the handlers that use them are ``async``):
nothing here is read from a worker thread while the loop writes it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from collector import __version__
from collector.alerting.router import Alerter
from collector.detectors.task import DetectorTask
from collector.detectors.wedge_watch import WedgeWatch
from collector.fleet.forwarder import FleetRows
from collector.ingest.hub import Hub
from collector.ingest.view import EngineInfo, IngestView
from collector.model import Event, EventKind, Severity, SourceStatus
from collector.settings import Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.sources.recorder import RecorderSource
from collector.sources.supervisor import SupervisedSource
from collector.storage.connect import STATEMENT_TIMEOUT_MS, hang_watchdog
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter
from collector.tasks import TaskSet

# a configured engine that serves /metrics but has had no recorder for this long is reported
RECORDER_MISSING_AFTER_S = 60.0
# The sidecar is behind (``behind`` in /healthz; the detectors hold their judgement meanwhile)
# when its loop ran this late, or a live writer's newest record has waited this long to be read.
LOOP_LATE_S = 1.0
RING_LATE_S = 3.0
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
class Lateness:
    """The sidecar's own lateness: its loop's (the heartbeat writes ``loop_lag_s``) and its ring
    reads'. Made before the stages that ask (the detector task skips its ticks while behind)."""

    recorders: Sequence[RecorderSource] = ()
    loop_lag_s: float = 0.0  # how late the loop's heartbeat last ran

    def behind(self) -> bool:
        """The sidecar itself is late: its loop ran late, or a ring's newest record is old while
        its writer is alive (cheap: for the detector task's every tick)."""
        if self.loop_lag_s > LOOP_LATE_S:
            return True
        return any((r.figures().get("lag_s") or 0.0) > RING_LATE_S for r in self.recorders)


@dataclass
class AppContext:
    settings: Settings
    hub: Hub  # ingest's front door (a manual snapshot is an event like any other)
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
    wedges: WedgeWatch | None = None  # the wedge watch (seconds since each engine's last step)
    port: Callable[[], int] | None = None  # the port served on (a bind to port 0 learns it late)
    lateness: Lateness = field(default_factory=Lateness)
    fleet: FleetRows | None = None  # the split placement's forwarder to the shared store (docs/fleet.md)
    snapshot_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    manual_wait_s: float = 5.0  # a manual POST waits this long for its commits before answering 202

    # -- queries ----------------------------------------------------------------------------
    @property
    def view(self) -> IngestView:
        return self.hub.view

    @property
    def loop_lag_s(self) -> float:
        return self.lateness.loop_lag_s

    def source_statuses(self) -> list[SourceStatus]:
        out = list(self.unsupported)
        for sup in self.supervised:
            out.extend(sup.statuses())
        return out

    def service_port(self) -> int:
        return self.port() if self.port is not None else self.settings.port

    def alert_stats(self) -> dict[str, int]:
        return self.alerter.stats() if self.alerter is not None else {}

    def recorder_missing(self) -> dict[str, str]:
        """Configured engines that answer /metrics but have no recorder: engine -> the fix."""
        now = time.time()
        if now - self.started_at < RECORDER_MISSING_AFTER_S:
            return {}
        engines = self._engines()
        unjoined = sorted(e.name for e in engines if not e.configured and e.steps_received)
        out = {}
        for e in engines:
            # a joined recorder's fingerprint arrives before any step: an idle engine has one
            if not e.configured or e.steps_received or e.fingerprint or e.last_scrape_ok is None:
                continue
            out[e.name] = RECORDER_UNJOINED_FIX.format(names=", ".join(unjoined[:4]), engine=e.name) if unjoined else RECORDER_FIX
        return out

    def _engines(self) -> list[EngineInfo]:
        view = self.view
        return [info for n in sorted(view.engine_names()) if (info := view.engine(n)) is not None]

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
        engines = self._engines()
        return {
            "recorder": rec,
            "steps_received": sum(e.steps_received for e in engines),
            "request_rows_received": sum(e.requests_received for e in engines),
            "steps_written": w.steps_written,
            "rows_pending": w.pending_rows,
            "rows_dropped": w.dropped,
            "rows_rejected": w.rejected,
            "steps_thinned": w.steps_thinned,
            "ingest_dropped": self.view.dropped,
            "snapshot_backlog": self.committer.backlog,
            "loop_lag_s": round(self.loop_lag_s, 4),
        }

    def behind(self) -> bool:
        return self.lateness.behind()

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
        behind = self.behind()
        # the degrade order: the continuous series coarser, then gaps (counted); never the fault path
        series = "coarse" if figures["recorder"].get("coarse") else "full"
        missing = self.recorder_missing()
        tasks = [dataclasses.asdict(t) for t in self.tasks.statuses()]
        held_in_memory = bool(self.committer.spool_error) and self.committer.backlog > 0
        db_up, wait = self.database_up(), self.database_wait_s()
        hung = wait is not None and wait > STATEMENT_TIMEOUT_MS / 1000
        shared = self.fleet.figures() if self.fleet is not None else None  # the split placement
        degraded = (
            db_up is False
            or (shared is not None and shared["shared_up"] is False)
            or behind
            or series != "full"
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
            "series": series,
            "series_gaps": figures["recorder"].get("gaps") or 0,
            "recorder_missing": missing,
            "shared_store": shared,
        }

    def engines_live(self) -> list[dict[str, Any]]:
        missing = self.recorder_missing()
        view = self.view
        out = []
        for e in self._engines():
            name = e.name
            last = view.last_step(name)
            scrape = view.last_scrape(name)
            state = view.engine_state(name)
            runs = view.run_info(name)
            out.append(
                {
                    "name": name,
                    "host": view.host,
                    "url": e.url,
                    "pair": e.pair,
                    "up": e.up,
                    # the verdict (collector/ingest/state.py): ok, idle, sleeping, paused, starting, wedged, down, gpu_fault
                    "state": state.state if state is not None else None,
                    "state_since": state.since if state is not None else None,
                    "state_reason": state.reason if state is not None else None,
                    "configured": e.configured,
                    "last_seen": e.last_seen,
                    "steps_in_ring": view.steps_held(name),
                    "steps_received": e.steps_received,
                    "request_rows_received": e.requests_received,
                    "last_step": last.step if last else None,
                    "run": runs.run or None,  # the engine's current run; the one before, kept apart, below
                    "previous_run": runs.previous_summary(),
                    "running": last.running if last else None,
                    "waiting": last.waiting if last else None,
                    "kv_cache_usage": last.kv_cache_usage if last else None,
                    "last_scrape": ({"ts": scrape.ts, "values": dict(scrape.values)} if scrape is not None else None),
                    "recorder": "missing" if name in missing else ("recording" if e.steps_received or e.fingerprint else "none"),
                    "recorder_fix": missing.get(name),
                    "vllm_version": e.fingerprint.get("vllm_version"),
                    "fingerprint": dict(e.fingerprint),
                }
            )
        return out

    def engine_health(self, name: str) -> dict[str, Any] | None:
        """The health verdict of one engine ({engine, state, since, reason, healthy}), or None
        for an engine the sidecar does not know."""
        state = self.view.engine_state(name)
        if state is None:
            return None
        return {"engine": name, "state": state.state, "since": state.since, "reason": state.reason, "healthy": state.healthy}

    def detector_states(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(s) for s in self.detectors.states()]

    async def manual_snapshot(self, engine: str | None, reason: str, *, wait_s: float | None = None) -> list[dict[str, Any]]:
        """Take a manual snapshot of one engine (or all); wait up to ``wait_s`` for the commits.
        Each answer has the snapshot id, or null with the state when not committed yet."""
        # One route for every manual snapshot: an event into ingest like any other; the trigger
        # policy opens a snapshot of the engine it names, or of every engine when it names none.
        ev = Event(
            kind=EventKind.MANUAL, ts=self.view.now(), source="api", message=reason or "manual snapshot", severity=Severity.INFO, engine=engine
        )
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
