"""The detector task: every second, the detectors run over ingest's live series, whether or not
any Alertmanager is configured (a critical anomaly takes its snapshot without paging). Each
published state change becomes an ANOMALY event into ingest (stored, and a trigger when
critical) and is handed to the consumers given at construction (the alert router)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from collector.detectors.base import DetectorState, Transition
from collector.detectors.config import DetectorThresholds
from collector.detectors.runner import DetectorRunner
from collector.ingest.view import IngestView
from collector.model import Event, EventKind, Severity
from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)

# What the detectors see of each engine's steps: its steps folded per second as they arrive
# (``ingest.window.SecondAggregates``, the last 120 s), not the steps themselves: 2,048 steps per
# engine per tick once cost a third of the sidecar's CPU at 8 engines, and the last 512 still
# most of the detector task's. The scrape series are kept up to date one scrape at a time by
# the runner (``detectors.series.ScrapeSeries``).


class DetectorTask:
    def __init__(
        self,
        view: IngestView,
        emit: Callable[[Event], None],
        thresholds: DetectorThresholds,
        *,
        interval: float = 1.0,
        consumers: Sequence[Callable[[Transition], None]] = (),
        behind: Callable[[], bool] = lambda: False,
    ) -> None:
        self.view = view
        self.emit = emit  # ingest's front door: anomalies are events like any other
        # While the sidecar itself is late (its loop, its ring reads), the newest steps it holds
        # are old: an engine would look stalled because we are. Those ticks are skipped, counted.
        self.behind = behind
        self.skipped = 0
        self.runner = DetectorRunner(thresholds, clock=view.now)
        self.forget = self.runner.forget  # a departed engine's series and states (collector.ingest.departures)
        self.interval = interval
        self.consumers = list(consumers)
        self.evaluations = 0

    def states(self) -> list[DetectorState]:
        return self.runner.states()

    async def run(self) -> None:
        while True:
            await sleep_to_tick(self.interval)
            try:
                self.tick()
            except Exception:
                log.exception("detector evaluation failed")

    def tick(self) -> list[Transition]:
        if self.behind():
            self.skipped += 1
            return []
        view = self.view
        # an engine that is down (its /metrics gone, or dead) has no live series to judge
        names = [n for n in view.engine_names() if (info := view.engine(n)) is not None and info.up is not False]
        steps = {name: view.step_seconds(name) for name in names}
        scrapes = {name: view.scrapes(name) for name in names}
        samples = view.gpu_series()
        transitions = self.runner.evaluate(steps, samples, scrapes)
        self.evaluations += 1
        for tr in transitions:
            cur = tr.current
            self.emit(
                Event(
                    kind=EventKind.ANOMALY,
                    ts=cur.ts,
                    source="detector",
                    message=f"{cur.name} {cur.state.value}: {cur.reason}",
                    severity=Severity(cur.state.value) if cur.state.value != "ok" else Severity.INFO,
                    engine=cur.labels.get("engine"),
                    gpu=cur.labels.get("gpu"),
                    data={
                        "detector": cur.name,
                        "state": cur.state.value,
                        "labels": cur.labels,
                        "suggested_action": cur.suggested_action,
                        "value": cur.value,
                    },
                )
            )
            for consumer in self.consumers:
                try:
                    consumer(tr)
                except Exception:
                    log.exception("detector consumer failed")
        return transitions
