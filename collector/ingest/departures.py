"""Engines that leave are forgotten: a departed engine's memory is given back after a grace period.

An engine departs when engine discovery says its pod is gone or being deleted (``Intake.engine``
with ``up=False``). For ``forget_after_s`` it stays as it was (its last steps for a snapshot of
its death, retaken or amended; its row in ``/api/v1/engines``, down); then ``Departures.sweep``
frees what the sidecar held for it: ingest's registry record and rings (``Intake.forget``), and
every stage's own per-engine state (the detectors' series and states, the recorder source's
ring readers, the writer's and the fleet's last-seen marks), each through its ``forget(engine)``.
Its snapshots and events are stored, and stay. A pod of the same name that comes back is a new
engine (it is registered again, as any other).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)

FORGET_AFTER_S = 900.0  # long after a death's snapshot has been committed and retaken
SWEEP_EVERY_S = 30.0


class Forgets(Protocol):
    """A stage that holds something per engine."""

    def forget(self, engine: str) -> None: ...


class Departed(Protocol):
    """Ingest's side (``collector.ingest.intake.Intake``)."""

    def departed_before(self, ts: float) -> list[str]: ...
    def forget(self, engine: str) -> None: ...


class Departures:
    def __init__(
        self,
        ingest: Departed,
        *,
        forget_after_s: float = FORGET_AFTER_S,
        others: Sequence[Forgets] = (),
        clock: Callable[[], float],
    ) -> None:
        self.ingest = ingest
        self.forget_after_s = forget_after_s
        self.others = list(others)
        self.clock = clock
        self.forgotten = 0  # engines forgotten since start

    def sweep(self) -> list[str]:
        """Forget every engine departed ``forget_after_s`` ago or more; returns their names."""
        names = self.ingest.departed_before(self.clock() - self.forget_after_s)
        for name in names:
            for other in self.others:
                try:
                    other.forget(name)
                except Exception:  # one stage failing to let go must not keep the others holding on
                    log.exception("forgetting engine %s", name)
            self.ingest.forget(name)
            self.forgotten += 1
        if names:
            log.info("forgot %d departed engine(s) (gone for %.0f s): %s", len(names), self.forget_after_s, ", ".join(names[:8]))
        return names

    async def run(self, every: float = SWEEP_EVERY_S) -> None:
        while True:
            await sleep_to_tick(every)
            self.sweep()
