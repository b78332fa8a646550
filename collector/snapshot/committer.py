"""The trigger policy and the snapshot committer.

Policy (``on_event``, a consumer of ingest's events, on the loop): a trigger captures a
snapshot of each engine it belongs to at once (``freeze.capture``: references only,
milliseconds), so what a snapshot holds is what the rings held at the fault, however late the
commit. One fault seen by several witnesses is one snapshot per engine: a trigger that comes
while the engine's snapshot is still open (``incident_window_s``) joins it as late evidence.
A later *distinct* fault is kept as its own snapshot, filed in the same incident: a GPU fault
(Xid, GPU lost) with an Xid code the open snapshot does not hold yet, or a critical anomaly,
arriving after the open snapshot was amended. We chose a snapshot of its own over amending the
first one because its rings differ (they end at the second fault), and the incident already
groups the two; its alert links the snapshot that holds it. A manual snapshot is always its own.

Durability of a trigger: the moment a trigger opens a snapshot, its intent is written
(``intent``: a small fsynced file in the spool folder), before the capture, the spool or the
database, and before a manual request is answered. It is removed once the snapshot and the
trigger's event row are committed (one transaction). At start, every intent without a committed
snapshot is retaken (``_retake``) from the recorder rings, which outlive the sidecar, with the
trigger's own time; the commit is idempotent on (host, engine, trigger id), so a trigger whose
snapshot was committed just before a kill is not stored twice. A trigger read again at start
(``data["replayed"]``: the kernel log resumes after its mark, ``collector.sources.kmsg_mark``)
is captured like a retake, cut at its time plus ``settle_s`` and not amended; one whose intent
is on disk is left to its retake. At a graceful stop, snapshots
still held in memory only are spooled and committed once more within a bound; what neither
takes is logged as lost (``close``).

Committer (``run``, a task): builds and encodes each capture off the loop, spools it to a file
(``spool``: atomic, fsynced) before the database sees it, commits it, and only then tells the
alert router (``on_committed``). A commit that fails (database down, hung, full) leaves the
snapshot spooled and the queue moves on; a retry task commits spooled snapshots in order when
the database is back, also after a restart. Each snapshot is amended once, ``settle_s`` after
its capture, with the evidence that arrived late (the workers' own tracebacks, vLLM's crash
dump, the last steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collector.ingest.hub import Hub
from collector.model import Event, EventKind, Severity
from collector.snapshot import intent, spool
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.freeze import CRASH_KINDS, Capture, capture, is_trigger
from collector.storage.db import StorageError
from collector.storage.repo import Repository, pack_parts
from collector.storage.writer import event_row

log = logging.getLogger(__name__)

DISTINCT_KINDS = frozenset({EventKind.XID, EventKind.GPU_LOST, EventKind.ANOMALY})
BUILD_ATTEMPTS = 3  # a capture's build, tried again after a failure before the amendment takes over


@dataclass
class OpenSnapshot:
    """One fault's snapshot of one engine, from its trigger until its window closes."""

    engine: str
    trigger: Event
    until: float
    late: list[Event] = field(default_factory=list)
    snapshot_id: int | None = None
    amended: bool = False
    spool_path: Path | None = None
    committed: asyncio.Future[int] | None = None
    error: str = ""
    spool_error: str = ""  # why its last spool write failed (held in memory only)
    intent_path: Path | None = None  # the trigger's intent, until the snapshot is committed
    retake: intent.Intent | None = None  # set on a snapshot retaken at start from its intent

    def holds(self, ev: Event) -> bool:
        return ev is self.trigger or any(ev is e for e in self.late) or (bool(ev.uid) and ev.uid in self.uids())

    def uids(self) -> set[str]:
        return {e.uid for e in (self.trigger, *self.late) if e.uid}

    def xids(self) -> set[int]:
        return {e.xid for e in (self.trigger, *self.late) if e.xid is not None}


@dataclass
class _Job:
    open: OpenSnapshot
    capture: Capture | None
    amend: bool
    spooled: spool.Spooled | None = None  # recovered from the spool (no capture)


class SnapshotCommitter:
    def __init__(
        self,
        hub: Hub,
        repo: Repository,
        *,
        spool_dir: Path,
        settle_s: float,
        window_s: float,
        gpu_seconds: float = 300.0,
        scrape_interval: float | None = None,
        on_committed: Sequence[Callable[[SnapshotDoc, Event], None]] = (),
        before_capture: Callable[[], object] | None = None,
        retry_every: float = 2.0,
    ) -> None:
        self.hub = hub
        self.repo = repo
        self.spool_dir = Path(spool_dir)
        self.settle_s = settle_s
        self.window_s = window_s
        self.gpu_seconds = gpu_seconds
        self.scrape_interval = scrape_interval
        self.on_committed = list(on_committed)
        # Reads what the in-engine recorder published but the sidecar has not polled yet, so a
        # capture already ends at the engine's last step (the service passes the recorder's poll).
        self.before_capture = before_capture
        self.retry_every = retry_every
        self._open: dict[str, OpenSnapshot] = {}
        self._recent: list[OpenSnapshot] = []  # closed and open, newest last (bounded)
        # first commits before amendments: a fault's first snapshot must not wait behind the
        # amendments of earlier ones (each is a full build and encode)
        self._queue: asyncio.PriorityQueue[tuple[int, int, _Job]] = asyncio.PriorityQueue()
        self._seq = 0
        self._waiting: list[_Job] = []  # spooled, not committed yet (database down)
        self._timers: list[asyncio.TimerHandle] = []  # amendments due (cancelled at close)
        # told of each trigger retaken at start (the alert router: its page may never have gone)
        self.on_retaken: list[Callable[[Event], None]] = []
        self._closing = False
        self.committed = 0
        self.failed = 0  # snapshots the database refused for good (set aside, logged)
        self.spool_error = ""  # why the last spool write failed ("" once one succeeds): /healthz
        self.commit_latency: list[float] = []  # seconds, trigger seen -> committed

    # -- policy (on the loop) ----------------------------------------------------------------
    def on_event(self, ev: Event, is_new: bool) -> None:
        if not is_trigger(ev):
            return
        if not is_new:
            return  # a second witness of a merged Xid: the first already decided
        targets = self.hub.engines_for(ev)
        if ev.kind is EventKind.ENGINE_DOWN:
            # An engine never seen up has no last steps to freeze: the event (and its alert)
            # says it is down; a snapshot would be empty.
            targets = [n for n in targets if self.hub.engines[n].ever_up]
        if ev.data.get("replayed"):
            # read again at start (the kernel log resumes after its mark): a trigger whose intent
            # the killed run left is retaken from that intent, not opened twice
            targets = [n for n in targets if not intent.pending_for(self.spool_dir, n, ev.uid)]
        for name in targets:
            self.snapshot_due(name, ev)

    def snapshot_due(self, engine: str, trigger: Event) -> OpenSnapshot:
        now = self.hub.clock()
        cur = self._open.get(engine)
        if cur is not None and now < cur.until and trigger.kind is not EventKind.MANUAL and not self._distinct(cur, trigger):
            cur.late.append(trigger)  # same fault, another witness: no second snapshot
            if cur.snapshot_id is not None:
                self._link_later(trigger, cur.snapshot_id)
            return cur
        # a trigger read again at start happened before it: the rings as they were at its time
        # plus the settle time, like a retake, and no amendment (what came later is not its evidence)
        replayed = bool(trigger.data.get("replayed"))
        opened = OpenSnapshot(engine, trigger, now + self.window_s, amended=replayed)
        self._write_intent(opened)  # first: durable before anything else (and before a POST answers)
        with contextlib.suppress(RuntimeError):
            opened.committed = asyncio.get_running_loop().create_future()
        if cur is None or cur.trigger.kind is not EventKind.MANUAL or trigger.kind is EventKind.MANUAL:
            self._open[engine] = opened
        self._recent.append(opened)
        del self._recent[:-500]
        cap = self._capture(engine, trigger)
        if replayed:
            later = _cut(cap, trigger.ts + self.settle_s, trigger.uid)
            cap.extra["replayed"] = {
                "steps_after_fault_left_out": later,
                "note": "read again at start after the kernel log's mark: the sidecar had not made it durable, or was stopped"
                + ("" if cap.steps else "; the rings no longer hold the steps before the fault"),
            }
        self._put(_Job(opened, cap, amend=False))
        return opened

    def _write_intent(self, o: OpenSnapshot) -> None:
        """One small fsynced file, on the loop: a trigger is rare and its durability is the point
        (milliseconds; ``BENCHMARKS.md``). A failure is logged and the snapshot goes on."""
        if not o.trigger.uid:
            o.trigger.uid = uuid.uuid4().hex  # triggers given straight to snapshot_due (tools, tests)
        try:
            o.intent_path = intent.write(self.spool_dir, o.engine, o.trigger, time.time())
        except OSError as exc:
            o.error = f"trigger not durable: {exc}"
            log.error(
                "cannot write the intent of the %s trigger of %s (%s): a kill before its snapshot is spooled loses it",
                o.trigger.kind.value,
                o.engine,
                exc,
            )

    def _put(self, job: _Job) -> None:
        self._seq += 1
        self._queue.put_nowait((1 if job.amend else 0, self._seq, job))

    def _distinct(self, cur: OpenSnapshot, ev: Event) -> bool:
        if not cur.amended or ev.kind not in DISTINCT_KINDS:
            return False
        if ev.kind is EventKind.ANOMALY:
            # a dead engine's series look stalled: an anomaly after its death is a consequence
            dead = cur.trigger.kind in CRASH_KINDS or cur.trigger.kind is EventKind.ENGINE_DOWN
            return ev.severity is Severity.CRITICAL and not dead
        return ev.xid is None or ev.xid not in cur.xids()

    def _capture(self, engine: str, trigger: Event) -> Capture:
        if self.before_capture is not None:
            try:
                self.before_capture()
            except Exception:  # a late read must never cost the snapshot
                log.exception("reading the recorder before a capture failed")
        return capture(self.hub, engine, trigger, gpu_seconds=self.gpu_seconds, scrape_interval=self.scrape_interval)

    def snapshots_for(self, ev: Event) -> dict[str, int | None]:
        """The snapshots this event started or joined: engine -> id (None until committed)."""
        return {o.engine: o.snapshot_id for o in self._recent if o.holds(ev)}

    def opens_for(self, ev: Event) -> list[OpenSnapshot]:
        return [o for o in self._recent if o.trigger is ev]

    @property
    def backlog(self) -> int:
        return self._queue.qsize() + len(self._waiting)

    # -- committing (a task) -------------------------------------------------------------------
    async def run(self) -> None:
        intents = await self._read_intents()
        await self._recover_spool(intents)
        await self._retake(intents)
        retry = asyncio.create_task(self._retry_loop(), name="snapshot-retry")
        try:
            while True:
                _, _, job = await self._queue.get()
                try:
                    await self._process(job)
                except Exception:  # one snapshot's failure must never stop the next
                    log.exception("snapshot of %s failed", job.open.engine)
                    self._fall_back(job)
                finally:
                    self._queue.task_done()
        finally:
            retry.cancel()
            await asyncio.gather(retry, return_exceptions=True)

    async def drain(self, timeout: float) -> None:
        """At shutdown: process what is queued and the amendments not due yet, within ``timeout``.

        The amendments are queued here, not through a timer of delay 0: ``join`` must see them
        (a timer fires after it returned, and the amendment was lost at every stop)."""
        self._closing = True  # no timer queues anything any more
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        for o in list(self._open.values()):
            if not o.amended and o.retake is None:
                o.amended = True
                self._put(_Job(o, self._capture(o.engine, o.trigger), amend=True))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)

    async def _process(self, job: _Job) -> None:
        o, cap = job.open, job.capture
        assert cap is not None
        doc, blobs = await self._build_off_loop(job)
        meta = {
            "incident_key": f"{o.trigger.kind.value}:{int(o.trigger.ts)}",
            "trigger_uid": o.trigger.uid,
            "snapshot_id": o.snapshot_id,
            "amend": job.amend,
            "counts": doc.counts(),
        }
        name = f"snapshot-{cap.trigger.ts:.6f}-{_safe(o.engine)}-{o.trigger.uid[:12]}.spool"
        try:
            if o.spool_path is not None and o.spool_path.name != name:
                o.spool_path.unlink(missing_ok=True)
            o.spool_path = await asyncio.to_thread(spool.write, self.spool_dir, name, doc.header(), meta, blobs)
            if self.spool_error:
                log.warning("the spool is writable again")
            self.spool_error = ""
        except OSError as exc:
            o.spool_path = None
            o.spool_error = str(exc)
            if not self.spool_error:  # once per failing spell: a full disk fails every snapshot alike
                log.error("cannot spool the snapshot of %s (%s): held in memory until committed", o.engine, exc)
            self.spool_error = f"{type(exc).__name__}: {exc}"
        spooled = spool.Spooled(o.spool_path or Path(name), doc.header(), meta, blobs)
        job.spooled = spooled
        if job.amend:
            o.amended = True
        if not job.amend and o.retake is None:
            self._schedule_amend(o)
        if not await self._commit(job):
            self._waiting = [j for j in self._waiting if j.open is not o]  # the newest version waits
            self._waiting.append(job)

    async def _build_off_loop(self, job: _Job) -> tuple[SnapshotDoc, dict[str, bytes]]:
        """The build, in a worker thread, tried again after a failure (``_fall_back`` when it
        fails for good)."""
        assert job.capture is not None
        for attempt in range(1, BUILD_ATTEMPTS):
            try:
                return await asyncio.to_thread(_build, job.capture)
            except Exception:
                log.exception("building the snapshot of %s failed (attempt %d); trying again", job.open.engine, attempt)
                await asyncio.sleep(0.05 * attempt)
        return await asyncio.to_thread(_build, job.capture)

    def _fall_back(self, job: _Job) -> None:
        """A first version that failed before its amendment was scheduled (its build, its spool
        write) is committed by the amendment's fresh capture ``settle_s`` later. It was dropped,
        and only the stop's drain (which amends every open snapshot) committed the fault: once
        101 s after it (``tests/snapshot/test_commit_race.py``)."""
        o = job.open
        if not job.amend and o.retake is None and not o.amended and o.snapshot_id is None:
            self._schedule_amend(o)

    async def _commit(self, job: _Job) -> bool:
        """One attempt; True when the database has it (or refused it for good)."""
        o, sp = job.open, job.spooled
        assert sp is not None
        doc = SnapshotDoc.from_export({k: v for k, v in sp.header.items() if k not in ("id", "incident_id")})
        counts = sp.meta.get("counts") or {}
        first, dup = o.snapshot_id is None, False
        try:
            if o.snapshot_id is None:
                sid, _, stored = await asyncio.to_thread(
                    self.repo.commit_snapshot,
                    doc,
                    incident_window_s=self.window_s,
                    incident_key=str(sp.meta.get("incident_key")),
                    blobs=sp.blobs,
                    counts=counts,
                    trigger_uid=o.trigger.uid or None,
                    trigger_event=event_row(o.trigger),
                )
                o.snapshot_id = sid
                if not stored and o.retake is None:
                    # The same trigger reported again (a restarted sidecar reading a dead engine's
                    # ring once more): its snapshot is stored; this capture of it holds less (the
                    # logs are followed from their end), so it neither replaces nor amends it.
                    o.amended, first, dup = True, False, True
                    log.info("trigger %s of %s already has snapshot %d; not stored again", o.trigger.kind.value, o.engine, sid)
            else:
                sid = o.snapshot_id
                await asyncio.to_thread(self.repo.amend_snapshot, sid, doc, blobs=sp.blobs, counts=counts)
            for ev in (o.trigger, *o.late):
                ev.data["snapshot_id"] = sid
                await asyncio.to_thread(self.repo.link_event, event_row(ev), sid)
        except StorageError as exc:
            o.error = str(exc)
            if exc.permanent:
                self.failed += 1
                log.error("the database refused the snapshot of %s for good (%s); its spool file is kept aside", o.engine, exc)
                if o.spool_path is not None:
                    spool.set_aside(o.spool_path, str(exc))
                self._drop_intent(o)  # retaking it would be refused again
                self._resolve(o)
                return True
            log.error(
                "snapshot of %s not committed yet (%s); spooled at %s, retrying", o.engine, exc, o.spool_path.name if o.spool_path else "memory"
            )
            return False
        o.error = ""
        self._waiting = [j for j in self._waiting if j.open is not o or j is job]
        if sp.path.exists() and sp.path.parent == self.spool_dir:
            sp.path.unlink(missing_ok=True)
        if o.spool_path == sp.path:
            o.spool_path = None
        self._drop_intent(o)
        if dup:
            self._resolve(o)  # already stored: the caller waiting for its id gets it
        if first:
            self.committed += 1
            self.commit_latency.append(max(time.time() - o.trigger.ts, 0.0))
            del self.commit_latency[:-1000]
            log.info("snapshot %d of %s committed (trigger %s: %s)", o.snapshot_id, o.engine, o.trigger.kind.value, o.trigger.message[:120])
            self._resolve(o)
            doc.id = o.snapshot_id
            for cb in self.on_committed:
                try:
                    cb(doc, o.trigger)
                except Exception:
                    log.exception("snapshot listener failed")
        return True

    def _drop_intent(self, o: OpenSnapshot) -> None:
        if o.intent_path is not None:
            intent.remove(o.intent_path)
            o.intent_path = None

    def _resolve(self, o: OpenSnapshot) -> None:
        if o.committed is not None and not o.committed.done():
            o.committed.set_result(o.snapshot_id or 0)

    def _schedule_amend(self, o: OpenSnapshot, delay: float | None = None) -> None:
        def due() -> None:
            if o.amended or self._closing:
                return
            o.amended = True  # one amendment; a distinct fault after this opens its own snapshot
            self._put(_Job(o, self._capture(o.engine, o.trigger), amend=True))

        with contextlib.suppress(RuntimeError):
            self._timers = [t for t in self._timers if not t.cancelled() and t.when() > asyncio.get_running_loop().time()]
            self._timers.append(asyncio.get_running_loop().call_later(self.settle_s if delay is None else delay, due))

    def _link_later(self, ev: Event, snapshot_id: int) -> None:
        async def link() -> None:
            ev.data["snapshot_id"] = snapshot_id
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(self.repo.link_event, event_row(ev), snapshot_id)

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(link())

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retry_every)
            try:
                while self._waiting and not self._closing:
                    job = self._waiting[0]
                    if not await self._commit(job):
                        break
                    self._waiting.pop(0)
            except Exception:  # this loop runs inside ``run``: a failure here must not end retrying
                log.exception("retrying the waiting snapshots failed")

    async def _read_intents(self) -> dict[tuple[str, str], intent.Intent]:
        """The intents an earlier run left: (engine, trigger id) -> intent; torn ones set aside."""
        # On the loop, so no intent of this run is being written meanwhile: the temporary files a
        # kill left mid-write (never whole by contract; their trigger's intent retakes it) go.
        _sweep_temporaries(self.spool_dir)
        out: dict[tuple[str, str], intent.Intent] = {}
        ours = {o.intent_path for o in self._recent}  # accepted by this run before the task started
        for path in await asyncio.to_thread(intent.pending, self.spool_dir):
            if path in ours:
                continue
            try:
                it = await asyncio.to_thread(intent.read, path)
            except intent.IntentError as exc:
                intent.set_aside(path, str(exc))
                continue
            out[(it.engine, it.event.uid)] = it
        return out

    async def _retake(self, intents: dict[tuple[str, str], intent.Intent]) -> None:
        """Triggers of an earlier run accepted but not committed (nor spooled): the snapshot is
        taken again from the rings, cut at the trigger's time plus ``settle_s`` (what the first
        commit and its amendment would have held), with the trigger's own time and fault."""
        for it in sorted(intents.values(), key=lambda i: i.event.ts):
            try:
                sid = await asyncio.to_thread(self.repo.snapshot_for_trigger, it.engine, it.event.uid)
            except StorageError:
                sid = None  # the database is down: retake; the commit is idempotent
            if sid is not None:
                # committed before the kill: its event row is stored with it, only the intent was left
                it.event.data["snapshot_id"] = sid
                with contextlib.suppress(StorageError):
                    await asyncio.to_thread(self.repo.store_event, event_row(it.event), sid)
                intent.remove(it.path)
                log.warning("trigger %s of %s (intent %s) already has snapshot %d", it.event.kind.value, it.engine, it.path.name, sid)
                continue
            o = OpenSnapshot(it.engine, it.event, 0.0, amended=True, intent_path=it.path, retake=it)
            cap = self._capture(it.engine, it.event)
            later = _cut(cap, it.event.ts + self.settle_s, it.event.uid)
            cap.extra["retaken"] = {
                **intent.to_meta(it),
                "retaken_at": time.time(),
                "steps_after_fault_left_out": later,
                "note": "retaken at start from the recorder rings: the sidecar stopped before committing it"
                + ("" if cap.steps else "; the rings no longer hold the steps before the fault"),
            }
            self._recent.append(o)
            log.warning(
                "retaking the snapshot of %s for the %s trigger at %.3f (intent %s)", it.engine, it.event.kind.value, it.event.ts, it.path.name
            )
            self._put(_Job(o, cap, amend=False))
            for cb in self.on_retaken:
                try:
                    cb(it.event)
                except Exception:
                    log.exception("retake listener failed")

    async def close(self, timeout: float) -> list[str]:
        """At a graceful stop, after ``drain``: no amendment fires any more, and every snapshot not
        committed yet is spooled (if it is held in memory only) and committed once more, within
        ``timeout``. Returns what is lost (neither spooled nor committed), one line each, logged.

        Lost means the capture taken at the fault: its trigger's intent (when it was written)
        survives and the next start retakes it, but only from the rings, which may have moved on,
        and without the log lines, GPU samples and events the sidecar held."""
        self._closing = True
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        deadline = asyncio.get_running_loop().time() + timeout
        lost: list[str] = []
        for job in list(self._waiting):
            o, sp = job.open, job.spooled
            assert sp is not None
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
            if o.spool_path is None:
                name = sp.path.name
                try:
                    o.spool_path = await asyncio.wait_for(
                        asyncio.to_thread(spool.write, self.spool_dir, name, sp.header, sp.meta, sp.blobs), left / 2
                    )
                    sp.path = o.spool_path
                    log.warning("snapshot of %s spooled at stop (%s)", o.engine, name)
                except (OSError, TimeoutError) as exc:
                    o.spool_error = str(exc) or "timed out"
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
            done = False
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    done = await asyncio.wait_for(self._commit(job), left)
            if done:
                self._waiting = [j for j in self._waiting if j is not job]
                continue
            if o.spool_path is not None:
                continue  # spooled: committed at the next start
            what = (
                f"engine {o.engine}, trigger {o.trigger.kind.value} at {o.trigger.ts:.3f} "
                f"({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(o.trigger.ts))}, event {o.trigger.uid}): "
                f"{o.trigger.message[:120]!r}"
            )
            kept = o.intent_path.name if o.intent_path is not None and o.intent_path.exists() else None
            after = (
                f"its trigger is kept ({kept}) and is retaken from the rings at the next start, if they still hold the fault"
                if kept
                else "its trigger is lost too"
            )
            log.critical(
                "SNAPSHOT LOST at stop: %s -- neither spooled (%s) nor committed (%s); %s",
                what,
                o.spool_error or "?",
                (o.error or "timed out").splitlines()[0][:300],
                after,
            )
            lost.append(what)
        while not self._queue.empty():  # captures the drain had no time to build
            _, _, job = self._queue.get_nowait()
            o = job.open
            if job.amend or o.snapshot_id is not None:
                continue  # the snapshot is committed; only its late evidence is not
            has_intent = o.intent_path is not None and o.intent_path.exists()
            what = f"engine {o.engine}, trigger {o.trigger.kind.value} at {o.trigger.ts:.3f} (event {o.trigger.uid})"
            log.critical(
                "SNAPSHOT LOST at stop: %s -- not taken before the stop; %s",
                what,
                "its trigger is kept and is retaken from the rings at the next start, if they still hold the fault"
                if has_intent
                else "its trigger is lost too",
            )
            lost.append(what)
        return lost

    async def _recover_spool(self, intents: dict[tuple[str, str], intent.Intent] | None = None) -> None:
        """Spooled snapshots of an earlier run (a database that was down, a crash mid-commit)."""
        intents = {} if intents is None else intents
        held = {j.spooled.path for j in self._waiting if j.spooled is not None}  # a restarted run: already held
        for path in await asyncio.to_thread(spool.pending, self.spool_dir):
            if path in held:
                continue
            try:
                sp = await asyncio.to_thread(spool.read, path)
                engine = str(sp.header["engine"])
                uid = str(sp.meta.get("trigger_uid") or "")
                kept = intents.pop((engine, uid), None) if uid else None
                if kept is not None:
                    trigger = kept.event  # the trigger as it was accepted (the header's is redacted)
                else:
                    trigger = intent.event_from_dict({"source": "spool", **sp.header["trigger"], "ts": sp.header["fault_ts"], "uid": uid})
            except (spool.SpoolError, KeyError, TypeError, ValueError, AttributeError) as exc:
                spool.set_aside(path, str(exc))
                continue
            o = OpenSnapshot(
                engine,
                trigger,
                0.0,
                snapshot_id=sp.meta.get("snapshot_id"),
                amended=True,
                spool_path=path,
                intent_path=kept.path if kept is not None else None,
            )
            job = _Job(o, None, amend=o.snapshot_id is not None, spooled=sp)
            self._recent.append(o)
            if not await self._commit(job):
                self._waiting.append(job)
            else:
                log.warning("committed spooled snapshot %s", path.name)


def _sweep_temporaries(directory: Path) -> None:
    try:
        leftovers = [p for pattern in (".snapshot-*.spool.tmp", ".trigger-*.intent.tmp") for p in directory.glob(pattern)]
    except OSError:
        return
    for path in leftovers:
        try:
            path.unlink()
        except OSError:
            continue
        log.warning("removed %s, a temporary file left by a sidecar stopped while writing it", path.name)


def _cut(cap: Capture, cut: float, trigger_uid: str) -> int:
    """A capture taken after its trigger's time (a retake, a trigger read again at start) as it
    was at ``cut``: later steps and events left out. Returns how many steps were left out."""
    keep = [i for i, s in enumerate(cap.steps) if s.ts <= cut]
    later = len(cap.steps) - len(keep)
    if cap.blocks is not None:  # each step's block as captured, cut with its step
        cap.blocks = [cap.blocks[i] for i in keep]
    cap.steps = [cap.steps[i] for i in keep]
    cap.events = [e for e in cap.events if e.ts <= cut and e.uid != trigger_uid]
    cap.events.append(cap.trigger)
    cap.events.sort(key=lambda e: e.ts)
    return later


def _build(cap: Capture) -> tuple[SnapshotDoc, dict[str, bytes]]:
    doc = cap.build()
    return doc, pack_parts(doc)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]
