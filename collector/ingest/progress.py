"""An engine's progress as ingest sees it: its last step and when, and the requests it holds.

The one thing the wedge watch (``collector.detectors.wedge_watch``) reads of ingest, kept per
engine by the registry at the cost of a few assignments per filed poll or scrape, never per row:

- from the recorder: the newest step number, its time, and running + waiting of the newest step
  that carries them (the stats half);
- from vLLM's ``/metrics``: the step and token counters (``iteration_tokens_total_count``, one
  observation per step; ``prompt_tokens_total``, ``generation_tokens_total``), whose change
  between two scrapes is progress at the later scrape's time (the step was taken within the
  interval before it), and the running and waiting gauges; and vLLM's sleep gauge
  (``engine_sleep_state{sleep_state="awake"}`` 0: the engine was put to sleep), and what its
  ``/is_paused`` said when the scrape asked (``MetricsScrape.paused``: vLLM's pause for RL weight
  updates holds requests without stepping, by design).

Progress is the newer of the two: a recorder that stopped while the counters still move is not
an engine that stopped. Held requests are the newest reading's (the watch adds the requests the
engine core accepted since its last step, from the workload log: ``IngestView.accepted_since``).
Nothing here judges; a wedge is the watch's call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from collector.model import PROGRESS_COUNTERS

AWAKE = 'engine_sleep_state{sleep_state="awake"}'


@dataclass(frozen=True, slots=True)
class Progress:
    """What the watch reads of one engine (times are unix seconds)."""

    step: int | None  # the recorder's newest step number (None: no recorder step seen)
    step_ts: float | None  # when the engine last moved: its newest step, or its counters' last change
    held: int | None  # running + waiting at the newest reading (None: never read)
    held_ts: float | None  # when ``held`` was read
    first_seen: float | None  # first record or scrape of it: the start of a wait before any step
    sleeping: bool  # vLLM says it was put to sleep (/sleep): holds nothing, steps nothing
    paused: bool  # vLLM says it is paused (/pause): holds requests, steps nothing, by design
    from_recorder: bool  # its steps come from the recorder (else only from /metrics)


class ProgressBook:
    """One engine's progress, updated by ingest as it files; read as a frozen ``Progress``."""

    __slots__ = ("_counters", "first_seen", "from_recorder", "held", "held_ts", "moved_ts", "paused", "sleeping", "step", "step_ts")

    def __init__(self) -> None:
        self.step: int | None = None
        self.step_ts: float | None = None  # the recorder's newest step
        self.moved_ts: float | None = None  # the counters' last change
        self.held: int | None = None
        self.held_ts: float | None = None
        self.first_seen: float | None = None
        self.sleeping = False
        self.paused = False
        self.from_recorder = False
        self._counters: tuple[float, ...] | None = None

    def saw_steps(self, step: int, ts: float, held: int | None, held_ts: float | None) -> None:
        """The newest of a poll's steps, and running + waiting of the newest one that has them."""
        if self.first_seen is None:
            self.first_seen = ts
        self.from_recorder = True
        if self.step_ts is None or ts >= self.step_ts:
            self.step, self.step_ts = step, ts
        if held is not None and held_ts is not None and (self.held_ts is None or held_ts >= self.held_ts):
            self.held, self.held_ts = held, held_ts

    def saw_scrape(self, ts: float, values: Mapping[str, float], paused: bool | None = None) -> None:
        """``paused``: /is_paused's answer when the scrape asked (None: not asked)."""
        if self.first_seen is None:
            self.first_seen = ts
        counters = tuple(values.get(k, -1.0) for k in PROGRESS_COUNTERS)
        moved = self._counters is not None and counters != self._counters and any(v >= 0 for v in counters)
        if moved:
            self.moved_ts = ts
        if paused is not None:
            self.paused = paused
        elif moved:
            self.paused = False  # it steps: whatever it was, it is not paused now
        self._counters = counters
        running, waiting = values.get("num_requests_running"), values.get("num_requests_waiting")
        if running is not None and waiting is not None and (self.held_ts is None or ts >= self.held_ts):
            self.held, self.held_ts = int(running + waiting), ts
        awake = values.get(AWAKE)
        self.sleeping = awake is not None and awake == 0

    def read(self) -> Progress:
        times = [t for t in (self.step_ts, self.moved_ts) if t is not None]
        return Progress(
            step=self.step,
            step_ts=max(times) if times else None,
            held=self.held,
            held_ts=self.held_ts,
            first_seen=self.first_seen,
            sleeping=self.sleeping,
            paused=self.paused,
            from_recorder=self.from_recorder,
        )
