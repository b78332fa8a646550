"""Ingest's front door: where every source's observations land.

``emit``/``emit_many`` (the sources' sink; synchronous, never blocking, on the event loop) file
each observation through ingest's one door (``Intake.emit``/``emit_many``: the engine registry,
the windows and rings, the writer's queue) and route each event (``collector.ingest.routing``) to the consumers given at construction. Data flows
one way: sources -> this -> consumers; what the other stages read goes through the read-only
view (``view``, ``collector.ingest.view``).

The parts are made before the hub, so the stages that consume its events can be given the view
at their own construction: ``Intake`` first, then the consumers, then ``Hub(intake, consumers)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from collector.ingest.config import IngestConfig
from collector.ingest.intake import Intake, RowSink
from collector.ingest.live import LiveView
from collector.ingest.routing import EventConsumer, EventRouter
from collector.model import Observation


class Hub:
    def __init__(self, intake: Intake, *, consumers: Sequence[EventConsumer] = ()) -> None:
        self.intake = intake
        self.router = EventRouter(intake, consumers=consumers)
        self.view = LiveView(intake)

    @property
    def host(self) -> str:
        return self.intake.host

    def emit(self, item: Observation) -> None:
        """File an observation (``Intake.emit``) and route the events waiting."""
        self.intake.emit(item)
        if self.intake.events_waiting:
            self.router.drain()

    def emit_many(self, items: Sequence[Observation]) -> None:
        """A source's poll of records in one call (``Intake.emit_many``); any event among them
        is routed after all are filed."""
        self.intake.emit_many(items)
        if self.intake.events_waiting:
            self.router.drain()


def hub_for(
    config: IngestConfig,
    *,
    rows: RowSink | None = None,
    clock: Callable[[], float] = time.time,
    proc_root: Path = Path("/proc"),
    scrape_seconds: float | None = None,
    consumers: Sequence[EventConsumer] = (),
) -> Hub:
    """Ingest in one call, for consumers that need no view at their construction (tools)."""
    return Hub(Intake(config, rows=rows, clock=clock, proc_root=proc_root, scrape_seconds=scrape_seconds), consumers=consumers)
