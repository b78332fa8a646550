"""The commit queue and its worker: each batch of captures is built and encoded off the loop,
spooled (``spool``: atomic, fsynced) before the database sees it, and committed, one
transaction per batch; only then is the alert router told (``on_committed``).

A batch is the snapshots one trigger opened (one per engine it was routed to), or their
amendments: they become durable together. First commits go before amendments (a fault's
first snapshot must not wait behind the amendments of earlier ones). A commit that fails
(database down, hung, full) leaves the snapshots spooled and the queue moves on; the retry
loop commits them in order when the database is back. A batch the database refuses for good
is committed one snapshot at a time, so one bad document does not take the others with it.
At a graceful stop, ``close`` spools and commits once more what is held in memory only, within
a bound, and says what is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collector.model import Event
from collector.snapshot import intent, spool
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.freeze import Capture
from collector.snapshot.latency import CommitLatency
from collector.snapshot.lifecycle import OpenSnapshot, Stored
from collector.storage.connect import StorageError
from collector.storage.repo import Repository, SnapshotAmend, SnapshotCommit, pack_parts
from collector.storage.writer import event_row
from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)

BUILD_ATTEMPTS = 3  # a capture's build, tried again after a failure before the amendment takes over


@dataclass
class Job:
    """A batch: snapshots committed in one transaction (first commits, or amendments)."""

    opens: list[OpenSnapshot]
    captures: list[Capture] | None  # None: recovered from the spool
    amend: bool
    spooled: list[spool.Spooled] = field(default_factory=list)

    def single(self, i: int) -> Job:
        return Job([self.opens[i]], None, self.amend, [self.spooled[i]])


class CommitQueue:
    def __init__(
        self,
        repo: Repository,
        *,
        spool_dir: Path,
        window_s: float,
        on_committed: Sequence[Callable[[SnapshotDoc, Event], None]] = (),
        retry_every: float = 2.0,
    ) -> None:
        self.repo = repo
        self.spool_dir = Path(spool_dir)
        self.window_s = window_s
        self.on_committed = tuple(on_committed)
        self.retry_every = retry_every
        self._queue: asyncio.PriorityQueue[tuple[int, int, Job]] = asyncio.PriorityQueue()
        self._seq = 0
        self._queued = 0  # snapshots in the queue (a batch holds several)
        self.waiting: list[Job] = []  # spooled, not committed yet (database down): one snapshot a job
        self.closing = False
        self.committed = 0
        self.failed = 0  # snapshots the database refused for good (set aside, logged)
        self.spool_error = ""  # why the last spool write failed ("" once one succeeds): /healthz
        self.latency = CommitLatency()  # trigger seen -> first commit: recorded here only

    def put(self, job: Job) -> None:
        self._seq += 1
        self._queued += len(job.opens)
        self._queue.put_nowait((1 if job.amend else 0, self._seq, job))

    @property
    def backlog(self) -> int:
        """Snapshots captured and not committed yet (queued, or waiting for the database)."""
        return self._queued + sum(len(j.opens) for j in self.waiting)

    async def run(self) -> None:
        retry = asyncio.create_task(self._retry_loop(), name="snapshot-retry")
        try:
            while True:
                _, _, job = await self._queue.get()
                self._queued -= len(job.opens)
                try:
                    await self._process(job)
                except Exception:  # one snapshot's failure must never stop the next
                    log.exception("snapshot of %s failed", ", ".join(o.engine for o in job.opens))
                finally:
                    self._queue.task_done()
                # the batch's captures (the engines' request blocks) and encoded parts are
                # megabytes: not held while the queue waits for the next fault (a job the
                # database did not take waits in ``waiting``, which holds its own)
                del job
        finally:
            retry.cancel()
            await asyncio.gather(retry, return_exceptions=True)

    async def join(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)

    def take_unprocessed(self) -> list[Job]:
        """What the worker never reached (at close)."""
        out = []
        while not self._queue.empty():
            _, _, job = self._queue.get_nowait()
            self._queued -= len(job.opens)
            out.append(job)
        return out

    # -- one batch ------------------------------------------------------------------------------
    async def _process(self, job: Job) -> None:
        assert job.captures is not None
        keep = [i for i, o in enumerate(job.opens) if not (job.amend and o.duplicate)]
        job.opens = [job.opens[i] for i in keep]
        captures = [job.captures[i] for i in keep]
        if not job.opens:
            return
        # each document built and spooled in a thread of its own: compression and fsync let go of
        # the interpreter, so a batch costs less than its snapshots one after another
        built = await self._build_batch(captures)
        job.spooled = list(
            await asyncio.gather(
                *(self._spool(o, job.amend, cap.trigger.ts, doc, blobs) for o, cap, (doc, blobs) in zip(job.opens, captures, built, strict=True))
            )
        )
        if not await self.commit(job):
            for i, o in enumerate(job.opens):  # each snapshot's newest version waits
                self.waiting = [j for j in self.waiting if o not in j.opens]
                self.waiting.append(job.single(i))

    async def _build_batch(self, captures: list[Capture]) -> list[tuple[SnapshotDoc, dict[str, bytes]]]:
        """The builds, a worker thread each, tried again after a failure. A first version whose
        build fails for good is still committed by its amendment's fresh capture, which the
        policy scheduled when it opened the snapshot."""
        for attempt in range(1, BUILD_ATTEMPTS):
            try:
                return await self._build_each(captures)
            except Exception:
                log.exception("building the snapshots failed (attempt %d); trying again", attempt)
                await asyncio.sleep(0.05 * attempt)
        return await self._build_each(captures)

    @staticmethod
    async def _build_each(captures: list[Capture]) -> list[tuple[SnapshotDoc, dict[str, bytes]]]:
        return list(await asyncio.gather(*(asyncio.to_thread(_build, cap) for cap in captures)))

    async def _spool(self, o: OpenSnapshot, amend: bool, ts: float, doc: SnapshotDoc, blobs: dict[str, bytes]) -> spool.Spooled:
        meta = {
            "incident_key": f"{o.trigger.kind.value}:{int(o.trigger.ts)}",
            "trigger_uid": o.trigger.uid,
            "snapshot_id": o.snapshot_id,
            "amend": amend,
            "counts": doc.counts(),
        }
        name = f"snapshot-{ts:.6f}-{_safe(o.engine)}-{o.trigger.uid[:12]}.spool"
        try:
            if o.spool_path is not None and o.spool_path.name != name:
                o.spool_path.unlink(missing_ok=True)
            o.spooled(await asyncio.to_thread(spool.write, self.spool_dir, name, doc.header(), meta, blobs))
            if self.spool_error:
                log.warning("the spool is writable again")
            self.spool_error = ""
        except OSError as exc:
            o.spool_failed(str(exc))
            if not self.spool_error:  # once per failing spell: a full disk fails every snapshot alike
                log.error("cannot spool the snapshot of %s (%s): held in memory until committed", o.engine, exc)
            self.spool_error = f"{type(exc).__name__}: {exc}"
        return spool.Spooled(o.spool_path or Path(name), doc.header(), meta, blobs)

    async def commit(self, job: Job) -> bool:
        """One attempt at the whole batch, one transaction; True when the database has it (or
        refused it for good)."""
        docs = [SnapshotDoc.from_export({k: v for k, v in sp.header.items() if k not in ("id", "incident_id")}) for sp in job.spooled]
        firsts = [o.snapshot_id is None for o in job.opens]
        try:
            results = await asyncio.to_thread(self._store, job, docs)
        except StorageError as exc:
            if exc.permanent:
                if len(job.opens) > 1:  # find the one the database refuses: the others go in
                    for i in range(len(job.opens)):
                        await self.commit(job.single(i))
                    return True
                o = job.opens[0]
                o.refuse(str(exc))
                self.failed += 1
                log.error("the database refused the snapshot of %s for good (%s); its spool file is kept aside", o.engine, exc)
                if o.spool_path is not None:
                    spool.set_aside(o.spool_path, str(exc))
                self._drop_intent(o)  # retaking it would be refused again
                return True
            for o in job.opens:
                o.commit_failed(str(exc))
            where = ", ".join(f"{o.engine} ({o.spool_path.name if o.spool_path else 'memory'})" for o in job.opens)
            log.error("snapshots not committed yet (%s); spooled: %s; retrying", exc, where)
            return False
        for o, sp, doc, first, (sid, stored) in zip(job.opens, job.spooled, docs, firsts, results, strict=True):
            self._done(o, sp, doc, first, sid, stored)
        return True

    def _store(self, job: Job, docs: list[SnapshotDoc]) -> list[tuple[int, bool]]:
        """The batch's first commits and amendments, in one transaction."""
        items: list[SnapshotCommit | SnapshotAmend] = []
        for o, sp, doc in zip(job.opens, job.spooled, docs, strict=True):
            events = [event_row(e) for e in (o.trigger, *o.late)]
            counts = sp.meta.get("counts") or {}
            if o.snapshot_id is None:
                items.append(
                    SnapshotCommit(
                        doc,
                        incident_key=str(sp.meta.get("incident_key")),
                        blobs=sp.blobs,
                        counts=counts,
                        trigger_uid=o.trigger.uid or None,
                        events=events,
                    )
                )
            else:
                items.append(SnapshotAmend(o.snapshot_id, doc, blobs=sp.blobs, counts=counts, events=events))
        return self.repo.commit_snapshots(items, incident_window_s=self.window_s)

    def _done(self, o: OpenSnapshot, sp: spool.Spooled, doc: SnapshotDoc, first: bool, sid: int, stored: bool) -> None:
        if first and o.snapshot_id == sid and o.life.stored is Stored.COMMITTED:
            # another attempt at its first version committed it meanwhile (a retry beside the
            # amendment's commit): this one is not stored, and the snapshot is already done
            first = False
        elif first and not stored and o.retake is None:
            # The same trigger reported again (a restarted sidecar reading a dead engine's ring
            # once more): its snapshot is stored; this capture of it holds less (the logs are
            # followed from their end), so it neither replaces nor amends it.
            o.found_stored(sid)
            first = False
            log.info("trigger %s of %s already has snapshot %d; not stored again", o.trigger.kind.value, o.engine, sid)
        elif first:
            o.commit_first(sid)
        else:
            o.commit_amendment(sid)
        self.waiting = [j for j in self.waiting if o not in j.opens or j.spooled[j.opens.index(o)] is sp]
        if sp.path.exists() and sp.path.parent == self.spool_dir:
            sp.path.unlink(missing_ok=True)
        o.spool_removed(sp.path)
        self._drop_intent(o)
        if first:
            self.committed += 1
            self.latency.observe(max(time.time() - o.trigger.ts, 0.0))
            log.info("snapshot %d of %s committed (trigger %s: %s)", sid, o.engine, o.trigger.kind.value, o.trigger.message[:120])
            doc.id = sid
            for cb in self.on_committed:
                try:
                    cb(doc, o.trigger)
                except Exception:
                    log.exception("snapshot listener failed")

    def _drop_intent(self, o: OpenSnapshot) -> None:
        if o.intent_path is not None:
            intent.remove(o.intent_path)
            o.intent_removed()

    def link_later(self, ev: Event, snapshot_id: int) -> None:
        """Late evidence of a committed snapshot: its stored row points at it."""

        async def link() -> None:
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(self.repo.link_event, event_row(ev), snapshot_id)

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(link())

    async def _retry_loop(self) -> None:
        while True:
            await sleep_to_tick(self.retry_every)
            try:
                while self.waiting and not self.closing:
                    job = self.waiting[0]
                    if not await self.commit(job):
                        break
                    self.waiting = [j for j in self.waiting if j is not job]
            except Exception:  # this loop runs inside ``run``: a failure here must not end retrying
                log.exception("retrying the waiting snapshots failed")

    # -- at a graceful stop ---------------------------------------------------------------------
    async def close(self, timeout: float) -> list[str]:
        """Every snapshot not committed yet is spooled (if it is held in memory only) and
        committed once more, within ``timeout``. Returns what is lost (neither spooled nor
        committed), one line each, logged.

        Lost means the capture taken at the fault: its trigger's intent (when it was written)
        survives and the next start retakes it, but only from the rings, which may have moved on,
        and without the log lines, GPU samples and events the sidecar held."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        lost: list[str] = []
        for job in list(self.waiting):
            o, sp = job.opens[0], job.spooled[0]
            left = max(deadline - loop.time(), 0.0)
            if o.spool_path is None:
                try:
                    path = await asyncio.wait_for(
                        asyncio.to_thread(spool.write, self.spool_dir, sp.path.name, sp.header, sp.meta, sp.blobs), left / 2
                    )
                    o.spooled(path)
                    sp.path = path
                    log.warning("snapshot of %s spooled at stop (%s)", o.engine, sp.path.name)
                except (OSError, TimeoutError) as exc:
                    o.spool_failed(str(exc) or "timed out")
            left = max(deadline - loop.time(), 0.0)
            done = False
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    done = await asyncio.wait_for(self.commit(job), left)
            if done:
                self.waiting = [j for j in self.waiting if j is not job]
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
        for job in self.take_unprocessed():  # captures the drain had no time to build
            if job.amend:
                continue  # the snapshots are committed; only their late evidence is not
            for o in job.opens:
                if o.snapshot_id is not None:
                    continue
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


def _build(cap: Capture) -> tuple[SnapshotDoc, dict[str, bytes]]:
    doc = cap.build()
    return doc, pack_parts(doc)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]
