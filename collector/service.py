"""The sidecar process: wires settings -> storage, hub, sources, writer, snapshots, alerts and
the HTTP app, runs them on one asyncio loop, and stops cleanly on SIGINT/SIGTERM, flushing
what it holds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from collector.ingest.hub import Hub
from collector.model import Event, SourceStatus
from collector.settings import Settings
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.committer import SnapshotManager
from collector.sources.recorder import RecorderSource
from collector.sources.registry import SOURCES
from collector.sources.supervisor import SupervisedSource
from collector.storage.db import StorageError, make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Context:
    """What the HTTP handlers see."""

    settings: Settings
    hub: Hub
    repo: Repository
    writer: BatchWriter
    snapshots: SnapshotManager
    loop: asyncio.AbstractEventLoop
    supervised: list[SupervisedSource] = field(default_factory=list)
    snapshot_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    alerter: Any = None
    unsupported: list[SourceStatus] = field(default_factory=list)
    port_getter: Any = None

    def source_statuses(self) -> list[SourceStatus]:
        out = list(self.unsupported)
        for sup in self.supervised:
            out.extend(sup.statuses())
        return out

    def service_port(self) -> int:
        return self.port_getter() if self.port_getter is not None else self.settings.port

    def alert_stats(self) -> dict[str, int]:
        if self.alerter is None:
            return {}
        try:
            return dict(self.alerter.stats())
        except Exception:
            return {}


class Service:
    def __init__(self, settings: Settings, *, extra_sources: list[Any] | None = None,
                 spool_dir: Path | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.extra_sources = extra_sources or []
        self.spool_dir = spool_dir or _default_spool(settings)
        self.ctx: Context | None = None
        self.server: _Server | None = None
        self.stop_event: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.on_snapshot: list[Any] = []
        self._migrate_every = 5.0  # callables(doc, trigger), e.g. the demo's printer

    def request_stop(self) -> None:
        if self.stop_event is not None:
            self.stop_event.set()

    async def run(self) -> None:
        settings = self.settings
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        db = make_engine(settings.database)
        migrated = True
        try:
            await asyncio.to_thread(upgrade, settings.database)
        except StorageError as exc:
            migrated = False
            log.error("database not ready (%s): the sidecar runs, holds what it records, and keeps retrying", exc)
        hub = Hub(settings)
        repo = Repository(db, host=hub.host)
        writer = BatchWriter(hub, repo, interval=settings.write_batch_interval)
        snaps = SnapshotManager(
            hub, repo, spool_dir=self.spool_dir, settle_s=settings.snapshot_settle_s,
            window_s=settings.incident_window_s, on_committed=self._committed,
        )  # fmt: skip
        ctx = self.ctx = Context(settings=settings, hub=hub, repo=repo, writer=writer, snapshots=snaps, loop=loop)
        ctx.port_getter = lambda: self.port
        ctx.alerter = self._alerter(ctx)
        for eng in settings.engines:
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(repo.register_engine, eng.name, url=eng.url, pair=eng.pair)

        sources: list[Any] = []
        for name, build in SOURCES:
            try:
                sources.extend(build(settings))
            except Exception as exc:  # a source that cannot even be built is reported, not fatal
                log.warning("source %s not started: %s", name, exc)
                ctx.unsupported.append(SourceStatus(name=name, up=False, supported=False, reason=str(exc)))
        sources.extend(self.extra_sources)
        ctx.supervised = [SupervisedSource(s) for s in sources]
        recorders = [s for s in sources if isinstance(s, RecorderSource)]
        snaps.before_freeze = lambda: [r.poll(hub) for r in recorders]

        from collector.api.app import create_app

        config = uvicorn.Config(create_app(ctx), host=settings.host, port=settings.port, log_level="warning",
                                access_log=False, lifespan="off")  # fmt: skip
        self.server = _Server(config)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.request_stop)

        tasks = [asyncio.create_task(s.run(hub), name=f"source:{s.name}") for s in ctx.supervised]
        tasks.append(asyncio.create_task(writer.run(), name="writer"))
        tasks.append(asyncio.create_task(snaps.run(), name="snapshots"))
        tasks.append(asyncio.create_task(self._retention(repo), name="retention"))
        if not migrated:
            tasks.append(asyncio.create_task(self._migrate_when_back(), name="migrate"))
        if ctx.alerter is not None:
            tasks.append(asyncio.create_task(ctx.alerter.run(), name="alerts"))
        server_task = asyncio.create_task(self.server.serve(), name="http")
        while not self.server.started and not server_task.done():
            await asyncio.sleep(0.02)
        if server_task.done():
            for t in tasks:
                t.cancel()
            exc = server_task.exception()
            raise SystemExit(f"cannot serve on {settings.host}:{settings.port}: {exc or 'bind failed'}")
        self.started.set()
        log.warning("flightrec serving on http://%s:%d (database %s)", settings.host, self.port, _safe_url(settings.database))
        await self.stop_event.wait()

        log.warning("stopping: flushing what is held")
        for t in tasks[: len(ctx.supervised)]:
            t.cancel()
        await asyncio.gather(*tasks[: len(ctx.supervised)], return_exceptions=True)
        await self._drain_snapshots(snaps)
        await writer.flush()
        for t in tasks[len(ctx.supervised) :]:
            t.cancel()
        if ctx.alerter is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ctx.alerter.aclose(), 5)  # flush what is queued
        self.server.should_exit = True
        await server_task
        await asyncio.gather(*tasks, return_exceptions=True)
        db.dispose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)

    @property
    def port(self) -> int:
        if self.server is not None and self.server.servers:
            for s in self.server.servers:
                for sock in s.sockets:
                    return int(sock.getsockname()[1])
        return self.settings.port

    async def _drain_snapshots(self, snaps: SnapshotManager, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not snaps._queue.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def _committed(self, doc: SnapshotDoc, trigger: Event) -> None:
        assert self.ctx is not None
        key = (doc.engine, trigger.kind.value)
        self.ctx.snapshot_counts[key] = self.ctx.snapshot_counts.get(key, 0) + 1
        if self.ctx.alerter is not None:
            self.ctx.alerter.snapshot_committed(doc, trigger)
        for cb in self.on_snapshot:
            cb(doc, trigger)

    def _alerter(self, ctx: Context) -> Any:
        if not self.settings.alertmanager:
            return None
        from collector.alerting.router import Alerter

        return Alerter(ctx)

    async def _migrate_when_back(self) -> None:
        """A database that was down at start gets its schema as soon as it answers; until then
        the writer and the snapshot manager hold and retry."""
        while True:
            await asyncio.sleep(self._migrate_every)
            try:
                await asyncio.to_thread(upgrade, self.settings.database)
            except StorageError:
                continue
            log.warning("database is reachable: migrated to head")
            return

    async def _retention(self, repo: Repository) -> None:
        r = self.settings.retention
        while True:
            await asyncio.sleep(r.interval_s)
            now = time.time()
            try:
                counts = await asyncio.to_thread(
                    repo.prune,
                    steps_before=now - r.steps_hours * 3600,
                    gpu_before=now - r.gpu_samples_hours * 3600,
                    events_before=now - r.events_days * 86400,
                    snapshots_before=None if r.snapshots_days is None else now - r.snapshots_days * 86400,
                )
                if any(counts.values()):
                    log.info("retention pruned %s", counts)
            except StorageError as exc:
                log.warning("retention skipped: %s", exc)


def _default_spool(settings: Settings) -> Path:
    if settings.database.startswith("sqlite") and "///" in settings.database:
        db_path = Path(settings.database.split("///", 1)[1])
        return db_path.parent / "flightrec-spool"
    return Path("flightrec-spool")


def _safe_url(url: str) -> str:
    from collector.redact import redact_text

    return redact_text(url)
