"""One state per engine, and since when: the verdict the API, ``/metrics``, the health probe and
``flightrec health --engine`` give.

    state      healthy   what it means
    ok         yes       it holds requests and steps
    idle       yes       it holds none (or has not said yet), answering
    sleeping   yes       vLLM put it to sleep (/sleep): it steps nothing and should not
    paused     yes       vLLM paused it (/pause, RL weight updates): it holds requests, steps nothing
    starting   yes       configured, never answered yet (loading, capturing graphs)
    wedged     no        it holds requests and has not stepped for far longer than its own pace
    down       no        its /metrics stopped answering, or it died (a fatal error in its log)
    gpu_fault  no        a critical Xid or a lost GPU routed to it

The marks that events leave (a wedge, a crash, a GPU fault) are kept by ``StateBook``; the rest
is read from what ingest knows at the time of asking. A fault's mark is cleared by the engine
stepping again well after it (``FAULT_CLEAR_S``: the steps in flight at the fault do not count),
a wedge's by its ``engine_resumed``. Pure apart from the book's own memory of since when.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.ingest.progress import Progress
from collector.model import CRASH_KINDS, Event, EventKind, Severity

STATES = ("ok", "idle", "sleeping", "paused", "starting", "wedged", "down", "gpu_fault")
# The health verdict's failures (503, a non-zero exit). ``starting`` is not among them: a liveness
# probe that failed a loading engine would restart it before it ever answered.
UNHEALTHY = frozenset({"wedged", "down", "gpu_fault"})
FAULT_CLEAR_S = 10.0


@dataclass(frozen=True, slots=True)
class EngineState:
    state: str  # one of STATES
    since: float | None  # when it entered the state (a wedge: its last step), unix s
    reason: str

    @property
    def healthy(self) -> bool:
        return self.state not in UNHEALTHY


class StateBook:
    """One engine's marks (from events) and the state last told, for its ``since``."""

    __slots__ = ("_fault", "_last", "_wedge")

    def __init__(self) -> None:
        self._wedge: tuple[float, str] | None = None  # (last step ts, reason)
        self._fault: tuple[str, float, str] | None = None  # (state, ts, reason)
        self._last: EngineState | None = None

    def saw_event(self, ev: Event) -> None:
        if ev.kind is EventKind.ENGINE_WEDGED:
            stuck_since = ev.data.get("last_step_ts")
            reason = ev.data.get("reason")
            self._wedge = (float(stuck_since) if isinstance(stuck_since, (int, float)) else ev.ts, str(reason) if reason else ev.message)
        elif ev.kind is EventKind.ENGINE_RESUMED:
            self._wedge = None
        elif ev.kind is EventKind.GPU_LOST or (ev.kind is EventKind.XID and ev.severity is Severity.CRITICAL):
            self._fault = ("gpu_fault", ev.ts, ev.message.strip().splitlines()[0][:200] if ev.message.strip() else ev.kind.value)
        elif ev.kind in CRASH_KINDS and ev.kind is not EventKind.XID:
            self._fault = ("down", ev.ts, f"{ev.kind.value}: {ev.message.strip().splitlines()[0][:200] if ev.message.strip() else ''}")

    def state(self, now: float, *, up: bool | None, configured: bool, progress: Progress) -> EngineState:
        """The state at ``now``. ``up``: the registry's (None before the first answer). A state
        with no time of its own (idle, ok...) is dated from the first time it was told."""
        fresh = self._judge(up=up, configured=configured, progress=progress)
        last = self._last
        if last is not None and last.state == fresh.state:
            since = fresh.since if fresh.since is not None else last.since
            if since != last.since or fresh.reason != last.reason:
                last = self._last = EngineState(last.state, since, fresh.reason)
            return last
        if fresh.since is None:
            fresh = EngineState(fresh.state, now, fresh.reason)
        self._last = fresh
        return fresh

    def _judge(self, *, up: bool | None, configured: bool, progress: Progress) -> EngineState:
        moved = progress.step_ts
        fault = self._fault
        if fault is not None and moved is not None and moved > fault[1] + FAULT_CLEAR_S:
            fault = self._fault = None  # it stepped again well after the fault: restarted or recovered
        if up is False:
            self._wedge = None  # a wedge ends with the engine's death; a restart starts afresh
            return EngineState("down", fault[1] if fault else None, fault[2] if fault else "its /metrics does not answer")
        if fault is not None:
            return EngineState(fault[0], fault[1], fault[2])
        if self._wedge is not None:
            return EngineState("wedged", self._wedge[0], self._wedge[1])
        if up is None:
            return EngineState("starting", None, "not answered yet" if configured else "named by a record, not answered yet")
        if progress.sleeping:
            return EngineState("sleeping", None, "vLLM says it is asleep (/sleep)")
        if progress.paused:
            return EngineState("paused", None, f"vLLM says it is paused (/is_paused), holding {progress.held or 0} requests")
        if not progress.held:
            return EngineState("idle", None, "holds no request" if progress.held is not None else "has not said what it holds yet")
        return EngineState("ok", None, f"holds {progress.held} requests and steps")
