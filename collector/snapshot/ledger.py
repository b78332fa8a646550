"""The snapshots the trigger policy opened, and which events each holds: the one place the link
from an event to its snapshot is kept in memory (events themselves are never written to; the
stored event row carries the link once committed).
"""

from __future__ import annotations

from collector.model import Event
from collector.snapshot.lifecycle import OpenSnapshot

__all__ = ["OpenSnapshot", "SnapshotLedger"]

RECENT_KEPT = 500


class SnapshotLedger:
    """The open snapshots, per engine the one late evidence joins, and the recent ones (bounded)."""

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
            o.replace_witness(ev)

    def holding_gpu(self, engine: str, gpu: str, now: float) -> OpenSnapshot | None:
        """The engine's newest snapshot still open that holds a fault of ``gpu``."""
        for o in reversed(self._recent):
            if o.engine == engine and o.is_open(now) and gpu in o.gpus:
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
