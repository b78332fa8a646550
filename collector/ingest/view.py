"""The read-only view of ingest that every later stage is given: the API and the sidecar's
``/metrics``, the detectors, the trigger policy and the snapshot capture.

It answers with copies and frozen records (``EngineInfo``, ``Route``, the ``StepRecord``s built
from the step windows' columns when asked: ``collector.ingest.window``) and the held records
themselves, which are never changed once held: a reader cannot change what ingest keeps, and
nothing but ingest's front door (the sources' sink: ``Hub.emit``/``emit_many``) files anything.
Queries run on the event loop, where ingest writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from collector.ingest.progress import Progress
from collector.ingest.state import EngineState
from collector.model import Event, GpuSample, LogLine, MetricsScrape, StepRecord

RouteBy = Literal["engine", "pid", "gpu", "all", "none"]


@dataclass(frozen=True)
class EngineInfo:
    """One engine as ingest knows it, at the time it was asked."""

    name: str
    url: str | None
    pair: str | None
    configured: bool
    up: bool | None
    ever_up: bool
    last_seen: float | None
    last_scrape_ok: float | None
    steps_received: int
    requests_received: int
    gpus: frozenset[int]  # configured, else learnt from NVML's process lists
    gpus_configured: bool
    fingerprint: Mapping[str, Any]


@dataclass(frozen=True)
class RunInfo:
    """Which run of an engine its rings hold (``collector.ingest.runs``): the current one, and the
    one before it, kept apart (its steps as they were when the current run began)."""

    run: int | None  # None: no step yet
    previous: int | None = None
    previous_ended: float | None = None  # when the current run's first step arrived
    previous_steps: int = 0
    previous_first_step: int | None = None
    previous_last_step: int | None = None

    def previous_summary(self) -> dict[str, Any] | None:
        """The previous run as the API and a snapshot say it, or None."""
        if self.previous is None:
            return None
        return {
            "run": self.previous,
            "ended_at": self.previous_ended,
            "steps_in_ring": self.previous_steps,
            "first_step": self.previous_first_step,
            "last_step": self.previous_last_step,
        }


@dataclass(frozen=True)
class Route:
    """The engines an event belongs to, and how that was decided: ``engine`` (it names one),
    ``pid`` (the worker it names: its process tree, or its pod's cgroup), ``gpu`` (the engines on its GPU), ``all`` (a GPU fault that
    matches no engine goes to every engine: better a snapshot too many than none), ``none``."""

    engines: tuple[str, ...]
    by: RouteBy


class IngestView(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def dropped(self) -> int: ...
    def now(self) -> float: ...

    # engines
    def engine_names(self) -> list[str]: ...
    def engine(self, name: str) -> EngineInfo | None: ...
    def route(self, ev: Event) -> Route: ...
    def progress(self, name: str) -> Progress | None: ...  # last step, its time, requests held
    def engine_state(self, name: str) -> EngineState | None: ...  # ok, idle, wedged, down, gpu_fault...
    def accepted_since(self, name: str, ts: float) -> tuple[int, float | None]: ...  # requests accepted after ts, not ended

    # an engine's rings
    def steps(self, engine: str) -> Sequence[StepRecord]: ...
    def run_info(self, engine: str) -> RunInfo: ...
    def previous_steps(self, engine: str) -> Sequence[StepRecord]: ...
    def recent_steps(self, engine: str, n: int) -> list[StepRecord]: ...
    def step_seconds(self, engine: str) -> list[StepRecord]: ...
    def last_step(self, engine: str) -> StepRecord | None: ...
    def last_known(self, engine: str, name: str) -> StepRecord | None: ...
    def has_step(self, engine: str, step: int) -> bool: ...
    def steps_held(self, engine: str) -> int: ...
    def scrapes(self, engine: str, *, since: float | None = None) -> list[MetricsScrape]: ...
    def last_scrape(self, engine: str) -> MetricsScrape | None: ...
    def log_lines(self, engine: str) -> list[LogLine]: ...
    def events(self, engine: str, *, since: float) -> list[Event]: ...
    def workload(self, engine: str, ts: float, *, crashed: bool) -> Any: ...

    # GPUs
    def gpus(self) -> dict[str, GpuSample]: ...
    def gpu_series(self) -> dict[str, list[GpuSample]]: ...
    def gpu_samples(self, *, since: float, gpus: set[int] | None = None) -> list[GpuSample]: ...
    def gpu_key(self, gpu: str) -> str: ...
    def xid_counts(self) -> dict[tuple[str, int], int]: ...
