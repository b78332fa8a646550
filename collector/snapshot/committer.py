"""The snapshot stage, wired: the trigger policy (``policy``: which events open which
snapshots, the trigger's intent, the capture), the ledger of open snapshots (``ledger``), the
commit queue and its worker (``commit``: build, spool, one transaction per batch, retry, the
last attempts at a stop) and the recovery at start (``recovery``: spooled snapshots and
intents an earlier run left, retaken from the rings).

Durability of a trigger: its intent is written the moment it opens a snapshot, before the
capture, the spool or the database, and before a manual request is answered; it is removed once
the snapshot and the trigger's event row are committed (one transaction). At a graceful stop,
snapshots still held in memory only are spooled and committed once more within a bound; what
neither takes is logged as lost (``close``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from collector.ingest.view import IngestView
from collector.model import Event
from collector.snapshot.commit import CommitQueue
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.hang import HangStacks
from collector.snapshot.latency import CommitLatency
from collector.snapshot.ledger import OpenSnapshot, SnapshotLedger
from collector.snapshot.policy import TriggerPolicy
from collector.snapshot.recovery import Recovery
from collector.storage.repo import Repository


class SnapshotCommitter:
    def __init__(
        self,
        view: IngestView,
        repo: Repository,
        *,
        spool_dir: Path,
        settle_s: float,
        window_s: float,
        gpu_seconds: float = 300.0,
        scrape_interval: float | None = None,
        on_committed: Sequence[Callable[[SnapshotDoc, Event], None]] = (),
        on_retaken: Sequence[Callable[[Event], None]] = (),
        read_now: Callable[[], object] | None = None,
        retry_every: float = 2.0,
        ledger: SnapshotLedger | None = None,
        stacks: HangStacks | None = None,
    ) -> None:
        self.ledger = ledger or SnapshotLedger()
        self.queue = CommitQueue(repo, spool_dir=spool_dir, window_s=window_s, on_committed=on_committed, retry_every=retry_every)
        self.policy = TriggerPolicy(
            view,
            self.ledger,
            self.queue,
            settle_s=settle_s,
            window_s=window_s,
            gpu_seconds=gpu_seconds,
            scrape_interval=scrape_interval,
            read_now=read_now,
            stacks=stacks,
        )
        self.recovery = Recovery(repo, self.ledger, self.queue, capture=self.policy.capture_one, settle_s=settle_s, on_retaken=on_retaken)
        self.settle_s = settle_s

    # -- what the other stages call ---------------------------------------------------------------
    def on_event(self, ev: Event, is_new: bool) -> None:
        self.policy.on_event(ev, is_new)

    def snapshots_for(self, ev: Event) -> dict[str, int | None]:
        return self.ledger.snapshots_for(ev)

    def opens_for(self, ev: Event) -> list[OpenSnapshot]:
        return self.ledger.opens_for(ev)

    @property
    def backlog(self) -> int:
        return self.queue.backlog

    @property
    def committed(self) -> int:
        return self.queue.committed

    @property
    def failed(self) -> int:
        return self.queue.failed

    @property
    def spool_error(self) -> str:
        return self.queue.spool_error

    @property
    def latency(self) -> CommitLatency:
        """Trigger seen -> first commit, recorded by the commit queue (the /metrics histogram reads it)."""
        return self.queue.latency

    @property
    def commit_latency(self) -> list[float]:
        """The newest commit latencies in seconds, oldest first (read from ``latency``)."""
        return self.queue.latency.recent()

    # -- the task ----------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.recovery.run()
        await self.queue.run()

    async def drain(self, timeout: float) -> None:
        """At shutdown: process what is queued and the amendments not due yet, within ``timeout``.

        The amendments are queued here, not through a timer of delay 0: the queue's ``join`` must
        see them, and a timer would fire after it returned."""
        self.policy.amend_now()
        await self.queue.join(timeout)

    async def close(self, timeout: float) -> list[str]:
        """After ``drain``: no amendment fires any more; what is not committed is spooled and
        committed once more within ``timeout``; returns what is lost (``CommitQueue.close``)."""
        self.policy.stop_timers()
        return await self.queue.close(timeout)
