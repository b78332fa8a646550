"""The snapshots the trigger policy opened, and which events each holds: the one place the link
from an event to its snapshot is kept in memory (events themselves are never written to; the
stored event row carries the link once committed).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.model import Event
from collector.snapshot import intent

RECENT_KEPT = 500


@dataclass(eq=False)  # one open snapshot is itself: compared by identity
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
    duplicate: bool = False  # its trigger's snapshot was stored before (a restart read it again)
    gpus: set[str] = field(default_factory=set)  # the GPUs whose faults it holds (``IngestView.gpu_key``)
    stacks: asyncio.Future[dict[str, Any]] | None = None  # a wedge's stacks being read (its amendment holds them)
    run: int | None = None  # the engine's run it is of (``collector.ingest.runs``; None: not known)

    def holds(self, ev: Event) -> bool:
        return ev is self.trigger or any(ev is e for e in self.late) or (bool(ev.uid) and ev.uid in self.uids())

    def uids(self) -> set[str]:
        return {e.uid for e in (self.trigger, *self.late) if e.uid}

    def xids(self) -> set[int]:
        return {e.xid for e in (self.trigger, *self.late) if e.xid is not None}

    def resolve(self) -> None:
        """Whoever waits for its id (a manual request) gets it."""
        if self.committed is not None and not self.committed.done():
            self.committed.set_result(self.snapshot_id or 0)


class SnapshotLedger:
    def __init__(self) -> None:
        self._open: dict[str, OpenSnapshot] = {}  # per engine, the snapshot late evidence joins
        self._recent: list[OpenSnapshot] = []  # closed and open, newest last (bounded)

    def current(self, engine: str) -> OpenSnapshot | None:
        return self._open.get(engine)

    def open(self, o: OpenSnapshot, *, current: bool = True) -> None:
        if current:
            self._open[o.engine] = o
        self.remember(o)

    def remember(self, o: OpenSnapshot) -> None:
        self._recent.append(o)
        del self._recent[:-RECENT_KEPT]

    def amend(self, ev: Event) -> None:
        """Hold ``ev`` in place of the event with its id (a later witness of an Xid merged into
        it): the snapshots commit, amend and link the merged event."""
        for o in self._recent:
            if o.trigger.uid == ev.uid:
                o.trigger = ev
            o.late = [ev if e.uid == ev.uid else e for e in o.late]

    def holding_gpu(self, engine: str, gpu: str, now: float) -> OpenSnapshot | None:
        """The engine's newest snapshot still open that holds a fault of ``gpu``."""
        for o in reversed(self._recent):
            if o.engine == engine and now < o.until and gpu in o.gpus:
                return o
        return None

    def still_open(self) -> list[OpenSnapshot]:
        return list(self._open.values())

    def recent(self) -> list[OpenSnapshot]:
        return list(self._recent)

    def snapshots_for(self, ev: Event) -> dict[str, int | None]:
        """The snapshots this event started or joined: engine -> id (None until committed)."""
        return {o.engine: o.snapshot_id for o in self._recent if o.holds(ev)}

    def opened_by(self, engine: str, trigger_uid: str) -> OpenSnapshot | None:
        """The snapshot of ``engine`` that the event with id ``trigger_uid`` opened, if recent."""
        return next((o for o in reversed(self._recent) if o.engine == engine and o.trigger.uid == trigger_uid), None)

    def opens_for(self, ev: Event) -> list[OpenSnapshot]:
        """The snapshots this event opened (a manual request's answer)."""
        return [o for o in self._recent if o.trigger is ev]
