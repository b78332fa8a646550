"""At start: what an earlier run left in the spool folder.

Spooled snapshots (a database that was down, a kill mid-commit) are committed. Trigger intents
without a committed snapshot (a kill between accepting a trigger and spooling its snapshot) are
retaken from the recorder rings, which outlive the sidecar, cut at the trigger's time plus
``settle_s`` (what the first commit and its amendment would have held), with the trigger's own
time and fault. The commit is idempotent on (host, engine, trigger id), so a trigger whose
snapshot was committed just before a kill is not stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from collector.model import Event
from collector.snapshot import intent, spool
from collector.snapshot.commit import CommitQueue, Job
from collector.snapshot.freeze import Capture, cut
from collector.snapshot.ledger import OpenSnapshot, SnapshotLedger
from collector.storage.connect import StorageError
from collector.storage.repo import Repository
from collector.storage.writer import event_row

log = logging.getLogger(__name__)

Intents = dict[tuple[str, str], intent.Intent]


class Recovery:
    def __init__(
        self,
        repo: Repository,
        ledger: SnapshotLedger,
        queue: CommitQueue,
        *,
        capture: Callable[[str, Event], Capture],
        settle_s: float,
        on_retaken: Sequence[Callable[[Event], None]] = (),
    ) -> None:
        self.repo = repo
        self.ledger = ledger
        self.queue = queue
        self.spool_dir = queue.spool_dir
        self.capture = capture
        self.settle_s = settle_s
        # told of each trigger retaken at start (the alert router: its page may never have gone)
        self.on_retaken = tuple(on_retaken)

    async def run(self) -> None:
        intents = await self.read_intents()
        await self.recover_spool(intents)
        await self.retake(intents)

    async def read_intents(self) -> Intents:
        """The intents an earlier run left: (engine, trigger id) -> intent; torn ones set aside."""
        # On the loop, so no intent of this run is being written meanwhile: the temporary files a
        # kill left mid-write (never whole by contract; their trigger's intent retakes it) go.
        _sweep_temporaries(self.spool_dir)
        out: Intents = {}
        ours = {o.intent_path for o in self.ledger.recent()}  # accepted by this run before the task started
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

    async def recover_spool(self, intents: Intents | None = None) -> None:
        """Spooled snapshots of an earlier run (a database that was down, a crash mid-commit)."""
        intents = {} if intents is None else intents
        held = {sp.path for j in self.queue.waiting for sp in j.spooled}  # a restarted run: already held
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
            sid = sp.meta.get("snapshot_id")
            o = OpenSnapshot.from_spool(
                engine,
                trigger,
                snapshot_id=sid if isinstance(sid, int) else None,
                spool_path=path,
                intent_path=kept.path if kept is not None else None,
            )
            job = Job([o], None, amend=o.snapshot_id is not None, spooled=[sp])
            self.ledger.remember(o)
            if not await self.queue.commit(job):
                self.queue.waiting.append(job)
            else:
                log.warning("committed spooled snapshot %s", path.name)

    async def retake(self, intents: Intents) -> None:
        """Triggers of an earlier run accepted but not committed (nor spooled)."""
        for it in sorted(intents.values(), key=lambda i: i.event.ts):
            try:
                sid = await asyncio.to_thread(self.repo.snapshot_for_trigger, it.engine, it.event.uid)
            except StorageError:
                sid = None  # the database is down: retake; the commit is idempotent
            if sid is not None:
                # committed before the kill: its event row is stored with it, only the intent was left
                with contextlib.suppress(StorageError):
                    await asyncio.to_thread(self.repo.link_event, event_row(it.event), sid)
                intent.remove(it.path)
                log.warning("trigger %s of %s (intent %s) already has snapshot %d", it.event.kind.value, it.engine, it.path.name, sid)
                continue
            o = OpenSnapshot.retaken(it)
            cap = self.capture(it.engine, it.event)
            later = cut(cap, it.event.ts + self.settle_s)
            cap.extra["retaken"] = {
                **intent.to_meta(it),
                "retaken_at": time.time(),
                "steps_after_fault_left_out": later,
                "note": "retaken at start from the recorder rings: the sidecar stopped before committing it"
                + ("" if cap.steps else "; the rings no longer hold the steps before the fault"),
            }
            self.ledger.remember(o)
            log.warning(
                "retaking the snapshot of %s for the %s trigger at %.3f (intent %s)", it.engine, it.event.kind.value, it.event.ts, it.path.name
            )
            self.queue.put(Job([o], [cap], amend=False))
            for cb in self.on_retaken:
                try:
                    cb(it.event)
                except Exception:
                    log.exception("retake listener failed")


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
