"""Internal: the sidecar process: wires settings -> storage, hub, sources, writer, snapshots, alerts and
the HTTP app, runs them on one asyncio loop, and stops cleanly on SIGINT/SIGTERM, flushing
what it holds."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from collector import malloc
from collector.alerting.router import Alerter
from collector.components import Components
from collector.context import AppContext, Lateness
from collector.detectors.runner import DetectorRunner
from collector.detectors.task import DetectorTask
from collector.detectors.wedge_watch import WedgeWatch
from collector.fleet.forwarder import FleetRows
from collector.fleet.placement import placement
from collector.fleet.stores import Stores, open_stores, prune, row_sink
from collector.ingest.departures import Departures
from collector.ingest.hub import Hub
from collector.ingest.intake import Intake
from collector.ingest.live import LiveView
from collector.ingest.reach import ReachLog
from collector.model import Event, SourceStatus
from collector.settings import Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.freeze import SCRAPE_SECONDS
from collector.snapshot.hang import HangStacks
from collector.snapshot.ledger import SnapshotLedger
from collector.sources.base import Source
from collector.sources.klog import KlogSource
from collector.sources.kmsg import KmsgSource
from collector.sources.kmsg_mark import MARK_FILE, ResumeMark, keep_mark
from collector.sources.recorder import RecorderSource
from collector.sources.registry import SOURCES
from collector.sources.supervisor import SupervisedSource
from collector.storage.connect import StorageError
from collector.storage.migrate_child import reachable, upgrade_in_child
from collector.storage.writer import BatchWriter
from collector.ticks import BASE_TICK_S, sleep_to_tick

log = logging.getLogger(__name__)

STOP_RETRY_S = 10.0  # at stop: the last spool and commit attempts of what is not durable yet
TRIM_AFTER_S = 2.0  # after a snapshot's commit: the heap's free pages go back (collector.malloc.trim)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the service owns SIGINT/SIGTERM), whose tick
    (the Date header, the exit check) runs on the loop's shared ticks (``collector.ticks``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        # uvicorn's own loop, with its 0.1 s sleep on the shared ticks: a wake of its own
        # ten times a second cost as much as the recorder's polls
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            await sleep_to_tick(BASE_TICK_S)
            should_exit = await self.on_tick(counter)


Context = AppContext  # the name tests and tools used


class Service:
    def __init__(self, settings: Settings, *, extra_sources: list[Source] | None = None, spool_dir: Path | None = None) -> None:
        self.settings = settings
        self.extra_sources = extra_sources or []
        self.spool_dir = spool_dir or _default_spool(settings)
        self.ctx: Context | None = None
        self.server: _Server | None = None
        self.stop_event: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.on_snapshot: list[Any] = []  # callables(doc, trigger), e.g. the demo's printer
        self._migrate_every = 5.0
        self.stores: Stores | None = None
        self.rows: BatchWriter | FleetRows | None = None
        self.lost_snapshots: list[str] = []  # snapshots lost at stop (neither spooled nor committed)
        self.steps = Components()  # the running service's steps (``_steps``), in start order
        self._server_task: asyncio.Task[None] | None = None
        self._source_tasks: list[asyncio.Task[None]] = []

    def request_stop(self) -> None:
        if self.stop_event is not None:
            self.stop_event.set()

    async def run(self) -> None:
        """Wires the stages, starts them as the named steps of ``steps`` and, at a stop request,
        stops them in the reverse of that order (``steps.stop_order``)."""
        loop = asyncio.get_running_loop()
        # Database work runs in threads, and a hung database holds one per call until its watchdog
        # cuts it (storage/watchdog.py): room for those beside the writer, the spool and the builds.
        loop.set_default_executor(ThreadPoolExecutor(max_workers=32, thread_name_prefix="flightrec"))
        self.stop_event = asyncio.Event()
        host = self.settings.host_name or socket.gethostname()
        migrated = await self._open_stores(host)
        parts = self._wire(host, migrated)
        await self._register_engines(parts)
        self.steps = self._steps(parts, migrated)
        await self.steps.start()
        self.started.set()
        log.info("flightrec serving on http://%s:%d (database %s)", self.settings.host, self.port, _safe_url(self.settings.database))
        await self.stop_event.wait()
        log.info("stopping: flushing what is held")
        await self.steps.stop()

    # -- wiring, once ------------------------------------------------------------------------------
    async def _open_stores(self, host: str) -> bool:
        """Opens the stores (collector/fleet/placement.py: what goes where) and migrates each, in a
        child process (Alembic stays out of this one). False: a database not ready yet."""
        stores = self.stores = open_stores(placement(self.settings), host=host)
        try:
            for url in stores.urls:
                await upgrade_in_child(url)
        except StorageError as exc:
            log.error("database not ready (%s): the sidecar runs, holds what it records, and keeps retrying", exc)
            return False
        return True

    def _wire(self, host: str, migrated: bool) -> _Parts:
        """The stages, each given what it needs at construction, data flowing one way:
        sources -> ingest (intake, routing) -> trigger policy -> commit queue -> store;
        ingest -> writer -> store; ingest's view -> detector task -> anomaly events back
        through ingest's front door; ingest events, detector transitions, commits -> alerts.
        docs/architecture.md draws it."""
        settings, stores = self.settings, self.stores
        assert stores is not None
        repo = stores.primary
        writer = BatchWriter(stores.series, interval=settings.write_batch_interval)
        # the migration just reached it, or not: /healthz says so, as /metrics does, before any write
        writer.db_up = migrated
        rows = self.rows = row_sink(stores, writer, host=host, interval_s=settings.fleet_series_interval_s)
        sources, unsupported = self._sources()
        recorders = [s for s in sources if isinstance(s, RecorderSource)]
        # the first step of the degrade order: the stored step series coarser while a ring lags
        writer.coarse = lambda: any(r.coarse for r in recorders)
        # the kernel log resumes after the mark of what it handled durably (sources/kmsg_mark.py)
        kernel_logs = [s for s in sources if isinstance(s, (KmsgSource, KlogSource))]
        for k in kernel_logs:
            k.mark = ResumeMark(self.spool_dir / MARK_FILE, source=k.path)
        lateness = Lateness(recorders)

        intake = Intake(settings, rows=rows, scrape_seconds=max(SCRAPE_SECONDS, DetectorRunner(settings.detectors).engine_history_s()) + 30.0)
        view = LiveView(intake)
        ledger = SnapshotLedger()
        # a wedged engine's stacks, read beside its snapshot (collector/snapshot/hang.py)
        stacks = HangStacks.from_settings(view, settings.stacks, recorder_dir=settings.recorder_dir if settings.recorder != "off" else None)
        alerter = self._alerter(intake.host, ledger, view)
        committer = SnapshotCommitter(
            view,
            repo,
            ledger=ledger,
            spool_dir=self.spool_dir,
            settle_s=settings.snapshot_settle_s,
            window_s=settings.incident_window_s,
            gpu_seconds=settings.snapshot_gpu_seconds,
            scrape_interval=settings.scrape_interval,
            on_committed=[self._committed],
            # a retaken trigger pages with its snapshot
            on_retaken=[functools.partial(alerter.on_event, is_new=True)] if alerter is not None else [],
            # the explicit step before a capture: file what the recorders published (an event they
            # find, a dead ring, is routed after the one being decided, never inside it)
            read_now=functools.partial(_poll_all, recorders, intake),
            stacks=stacks,
        )
        hub = Hub(intake, consumers=[committer.on_event, *([alerter.on_event] if alerter is not None else [])])
        detectors = DetectorTask(
            view, hub.emit, settings.detectors, behind=lateness.behind, consumers=[alerter.on_transition] if alerter is not None else []
        )
        # a wedge: requests held, no step for far longer than the engine's pace (an event back into ingest)
        wedges = WedgeWatch(view, hub.emit, settings.detectors.wedge, scrape_interval_s=settings.scrape_interval, behind=lateness.behind)
        fleet = rows if isinstance(rows, FleetRows) else None
        # engines that leave are forgotten after a grace period (collector/ingest/departures.py)
        departures = Departures(
            intake,
            forget_after_s=settings.engine_forget_after_s,
            others=[detectors, wedges, *recorders, writer, *([fleet] if fleet is not None else [])],
            clock=intake.clock,
        )
        ctx = self.ctx = AppContext(
            settings=settings,
            hub=hub,
            repo=repo,
            writer=writer,
            committer=committer,
            detectors=detectors,
            loop=asyncio.get_running_loop(),
            recorders=recorders,
            supervised=[SupervisedSource(s) for s in sources],
            unsupported=unsupported,
            alerter=alerter,
            wedges=wedges,
            port=lambda: self.port,
            lateness=lateness,
            fleet=fleet,
        )
        return _Parts(stores, writer, fleet, kernel_logs, stacks, committer, detectors, wedges, departures, ctx)

    def _sources(self) -> tuple[list[Source], list[SourceStatus]]:
        """Every source the settings turn on, and the ones that cannot run here (reported, not fatal)."""
        sources: list[Source] = []
        unsupported: list[SourceStatus] = []
        for entry in SOURCES:
            try:
                sources.extend(entry.build(self.settings))
            except Exception as exc:  # a source that cannot even be built is reported, not fatal
                log.warning("source %s not started: %s", entry.name, exc)
                unsupported.append(SourceStatus(name=entry.name, up=False, supported=False, reason=str(exc)))
        sources.extend(self.extra_sources)
        return sources, unsupported

    def _alerter(self, host: str, ledger: SnapshotLedger, view: LiveView) -> Alerter | None:
        if not self.settings.alertmanager:
            return None
        return Alerter(
            self.settings,
            host=host,
            snapshots_for=ledger.snapshots_for,
            engine_up=lambda n: info.up if (info := view.engine(n)) is not None else None,
            port=lambda: self.port,
            gpus=lambda: list(view.gpus().values()),
        )

    async def _register_engines(self, parts: _Parts) -> None:
        for eng in self.settings.engines:
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(parts.ctx.repo.register_engine, eng.name, url=eng.url, pair=eng.pair)

    # -- the steps, in start order; stopped in reverse ---------------------------------------------
    def _steps(self, p: _Parts, migrated: bool) -> Components:
        """Started top to bottom, stopped bottom to top. At a start, the stages and the sources
        run while the HTTP server binds (``listening`` waits for it last). At a stop: the sources
        end first (no new input), then what is held is made durable (snapshots drained, spooled
        or committed, the writer's last flush), then the stages (the kernel log's mark after the
        last flush), the alerts (what is queued sent), the HTTP server, the stores, the signal
        handlers."""
        steps = Components()
        ctx = p.ctx
        loop = asyncio.get_running_loop()
        steps.add("signals", start=functools.partial(self._signals, loop, add=True), stop=functools.partial(self._signals, loop, add=False))
        steps.add("stores", stop=p.stores.dispose)
        steps.add("http", start=functools.partial(self._serve, ctx), stop=self._stop_serving)
        if ctx.alerter is not None:
            alerter = ctx.alerter
            task = _Task(ctx, "alerts", alerter.run)
            steps.add("alerts", start=task.start, stop=functools.partial(task.stop, then=alerter.aclose, within_s=5.0))
        # the stages run supervised (collector/tasks.py): one that raises is restarted, and says so
        stages: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("writer", p.writer.run),
            ("snapshots", p.committer.run),
            ("detectors", p.detectors.run),
            ("wedges", p.wedges.run),
            ("retention", functools.partial(self._retention, p.stores)),
            ("departures", p.departures.run),
        ]
        if p.fleet is not None:
            stages.append(("fleet", p.fleet.run))
        stages.append(("heartbeat", functools.partial(self._heartbeat, ctx)))
        rows = p.fleet if p.fleet is not None else p.writer
        for i, k in enumerate(p.kernel_logs):  # stopped after the writer's last flush: it saves the last mark
            stages.append((f"kmsg-mark:{i}", functools.partial(keep_mark, k, rows)))  # the sink events go to
        for name, run in stages:
            stage = _Task(ctx, name.partition(":")[0], run)
            steps.add(name, start=stage.start, stop=stage.stop)
        if not migrated:
            migrate = _Task(ctx, "migrate", self._migrate_when_back, once=True)
            steps.add("migrate", start=migrate.start, stop=migrate.stop)
        steps.add("durability", stop=functools.partial(self._make_durable, p))
        steps.add("sources", start=functools.partial(self._start_sources, ctx), stop=self._stop_sources)
        steps.add("listening", start=self._listening)
        return steps

    def _signals(self, loop: asyncio.AbstractEventLoop, *, add: bool) -> None:
        """The service owns SIGINT/SIGTERM: each asks for a graceful stop."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                if add:
                    loop.add_signal_handler(sig, self.request_stop)
                else:
                    loop.remove_signal_handler(sig)

    def _serve(self, ctx: AppContext) -> None:
        """The HTTP server's task; it binds while the later steps start (``_listening``)."""
        from collector.api.app import create_app

        settings = self.settings
        config = uvicorn.Config(create_app(ctx), host=settings.host, port=settings.port, log_level="warning", access_log=False, lifespan="off")
        self.server = _Server(config)
        self._server_task = asyncio.create_task(self.server.serve(), name="http")

    async def _listening(self) -> None:
        """Until the HTTP server listens; a bind that failed stops the service."""
        server, task = self.server, self._server_task
        assert server is not None and task is not None
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if task.done():
            failure = task.exception()
            raise SystemExit(f"cannot serve on {self.settings.host}:{self.settings.port}: {failure or 'bind failed'}")

    async def _stop_serving(self) -> None:
        if self.server is None or self._server_task is None:
            return
        if self._server_task.done():  # it never listened (``_listening`` said why)
            return
        self.server.should_exit = True
        await self._server_task

    def _start_sources(self, ctx: AppContext) -> None:
        self._source_tasks = [asyncio.create_task(s.run(ctx.hub), name=f"source:{s.name}") for s in ctx.supervised]

    async def _stop_sources(self) -> None:
        for t in self._source_tasks:
            t.cancel()
        await asyncio.gather(*self._source_tasks, return_exceptions=True)

    async def _make_durable(self, p: _Parts) -> None:
        """What is held in memory is made durable: the snapshots drained, then spooled or
        committed once more (what neither takes is logged as lost, and the process exits
        non-zero: collector.cli.serve), the writer's last flush."""
        await p.committer.drain(timeout=10.0)
        self.lost_snapshots = await p.committer.close(timeout=STOP_RETRY_S)
        if p.stacks is not None:
            p.stacks.close()
        await p.writer.flush(everything=True)
        if p.fleet is not None:
            await p.fleet.flush(everything=True)  # into the outbox at least; shipped if the shared store answers
        if p.writer.pending_rows or p.committer.backlog:  # the database is down or full: say what it did not take
            log.error(
                "stopping with %d rows and %d snapshots not stored (%s); spooled snapshots are committed at the "
                "next start, and steps still in the rings are read again",
                p.writer.pending_rows,
                p.committer.backlog,
                p.writer.last_error or "database not answering",
            )

    async def _heartbeat(self, ctx: AppContext, every: float = 0.2) -> None:
        """Measures the loop's own lateness: a sidecar that falls behind says so (/healthz); and
        says once, in the log, when a configured engine serves /metrics but has no recorder, and
        when there are no engines or one stops or starts answering (ingest/reach.py)."""
        told: set[str] = set()
        reach, started = ReachLog(), time.monotonic()
        n = 0
        while True:
            if n % 25 == 0:  # at start, then every 5 s: engines none, unreachable, back
                view = ctx.view
                engines = [info for name in view.engine_names() if (info := view.engine(name)) is not None]
                up = {e.name: e.up for e in engines}
                for line in reach.check(up, {e.name: e.url for e in engines}, time.monotonic() - started):
                    log.warning("%s", line)
            due = await sleep_to_tick(every)
            ctx.lateness.loop_lag_s = max(asyncio.get_running_loop().time() - due, 0.0)
            n += 1
            if n % 25 == 0:
                for name, fix in ctx.recorder_missing().items():
                    if name not in told:
                        told.add(name)
                        log.warning("engine %s answers /metrics but no recorder writes its steps: %s", name, fix)

    @property
    def port(self) -> int:
        if self.server is not None and self.server.servers:
            for s in self.server.servers:
                for sock in s.sockets:
                    return int(sock.getsockname()[1])
        return self.settings.port

    def _committed(self, doc: SnapshotDoc, trigger: Event) -> None:
        assert self.ctx is not None
        key = (doc.engine, trigger.kind.value)
        self.ctx.snapshot_counts[key] = self.ctx.snapshot_counts.get(key, 0) + 1
        if self.ctx.alerter is not None:
            self.ctx.alerter.snapshot_committed(doc, trigger)
        for cb in self.on_snapshot:
            cb(doc, trigger)
        # the snapshot's copies are freed once its commit lets go of them: their pages back then
        with contextlib.suppress(RuntimeError):  # (no loop: a test calling it alone)
            asyncio.get_running_loop().call_later(TRIM_AFTER_S, malloc.trim)

    async def _migrate_when_back(self) -> None:
        """A database that was down at start gets its schema as soon as it answers; until then
        the writer and the snapshot manager hold and retry."""
        while True:
            await asyncio.sleep(self._migrate_every)
            urls = list(self.stores.urls) if self.stores is not None else []
            if not all([await asyncio.to_thread(reachable, url) for url in urls]):
                continue  # a child process starts only once every store answers
            try:
                for url in urls:
                    await upgrade_in_child(url)
            except StorageError as exc:
                log.warning("database answers but is not migrated yet: %s", exc)
                continue
            log.warning("database is reachable: migrated to head")
            return

    async def _retention(self, stores: Stores) -> None:
        r = self.settings.retention
        first = True
        while True:
            # a Postgres store makes its time partitions ahead at start, then every interval
            await asyncio.sleep(min(r.interval_s, 5.0) if first else r.interval_s)
            first = False
            try:
                counts = await asyncio.to_thread(prune, stores, r, partition_hours=self.settings.fleet_partition_hours)
                if any(counts.values()):
                    log.info("retention: %s", counts)
            except StorageError as exc:
                log.warning("retention skipped: %s", exc)


@dataclass(frozen=True)
class _Parts:
    """The wired stages the steps start and stop."""

    stores: Stores
    writer: BatchWriter
    fleet: FleetRows | None
    kernel_logs: list[KmsgSource | KlogSource]
    stacks: HangStacks | None
    committer: SnapshotCommitter
    detectors: DetectorTask
    wedges: WedgeWatch
    departures: Departures
    ctx: AppContext


class _Task:
    """One supervised stage (``AppContext.tasks``) as a step: started, then cancelled at stop."""

    def __init__(self, ctx: AppContext, name: str, run: Callable[[], Awaitable[None]], *, once: bool = False) -> None:
        self.ctx, self.name, self.run, self.once = ctx, name, run, once
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = self.ctx.tasks.start(self.name, self.run, once=self.once)

    async def stop(self, then: Callable[[], Awaitable[None]] | None = None, within_s: float = 5.0) -> None:
        """Cancelled; ``then`` (a last flush) awaited within ``within_s`` before the task ends."""
        if self.task is None:
            return
        self.task.cancel()
        if then is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(then(), within_s)
        await asyncio.gather(self.task, return_exceptions=True)


def _poll_all(recorders: list[RecorderSource], intake: Intake) -> None:
    for r in recorders:
        r.poll(intake, everything=True)


def _default_spool(settings: Settings) -> Path:
    if settings.spool_dir is not None:
        return settings.spool_dir
    if settings.database.startswith("sqlite") and "///" in settings.database:
        db_path = Path(settings.database.split("///", 1)[1])
        return db_path.parent / "flightrec-spool"
    return Path("flightrec-spool")


def _safe_url(url: str) -> str:
    from collector.redact import redact_text

    return redact_text(url)
