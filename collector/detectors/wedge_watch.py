"""The wedge watch: once a second, each engine's progress (``IngestView.progress``: its last step,
when, the requests it holds) judged by ``detectors.wedge``; a wedge becomes one CRITICAL
``engine_wedged`` event into ingest (a snapshot trigger: the snapshot with the engine's stacks,
the ``VllmEngineWedged`` page, the engine's state), and the first step after it one INFO
``engine_resumed`` event that says how long it was stuck (``stuck_s``).

Per engine and per tick it reads a handful of fields: no step, no row. The engine's pace is the
longest gap between two of its movements while it held requests, as the ticks see it (several
steps between two ticks count as one gap of at most the tick: an upper bound, and only gaps
that could raise the threshold above its floor are kept).

Not wedged: an engine that holds nothing (idle), one asleep (vLLM's ``/sleep``) or paused (its
``/is_paused``, asked when its counters stand still with requests held), one that is down
or never answered (its own states), and any engine while the sidecar itself is behind (its own
late reads would look like the engine's stop; those ticks are skipped, as the detectors' are).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from collector.detectors.config import WedgeThresholds
from collector.detectors.wedge import ACTION, NAME, judge_wedge
from collector.ingest.view import IngestView
from collector.model import Event, EventKind, Severity
from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Watch:
    moved_at: float | None = None  # its last movement as last seen
    step: int | None = None  # its recorder step number then
    busy_since: float | None = None  # first seen holding requests in this busy spell
    gaps: deque[tuple[float, float]] = field(default_factory=deque)  # (when seen, gap s), long ones only
    wedged: Event | None = None  # the open wedge's event
    stuck_s: float | None = None  # seconds since its last step while it holds requests (None: holds none)


class WedgeWatch:
    def __init__(
        self,
        view: IngestView,
        emit: Callable[[Event], None],
        thresholds: WedgeThresholds,
        *,
        scrape_interval_s: float | None = None,
        behind: Callable[[], bool] = lambda: False,
    ) -> None:
        self.view = view
        self.emit = emit
        self.thr = thresholds
        self.scrape_interval_s = scrape_interval_s
        self.behind = behind
        self.skipped = 0
        self._engines: dict[str, _Watch] = {}

    async def run(self) -> None:
        while True:
            await sleep_to_tick(self.thr.interval_s)
            try:
                self.tick()
            except Exception:
                log.exception("wedge watch failed")

    def forget(self, engine: str) -> None:
        """A departed engine (``collector.ingest.departures``): its watch goes."""
        self._engines.pop(engine, None)

    def seconds_since_step(self) -> dict[str, float]:
        """Per known engine: seconds since its last step while it holds requests, else 0
        (``flightrec_engine_seconds_since_step``)."""
        return {name: (w.stuck_s or 0.0) for name, w in self._engines.items()}

    def wedged(self) -> dict[str, bool]:
        return {name: w.wedged is not None for name, w in self._engines.items()}

    def tick(self) -> list[Event]:
        if not self.thr.enabled:
            return []
        if self.behind():
            self.skipped += 1
            return []
        now = self.view.now()
        out: list[Event] = []
        for name in self.view.engine_names():
            ev = self._look(name, now)
            if ev is not None:
                out.append(ev)
                self.emit(ev)
            self.view.engine_state(name)  # its state read each tick: a change is dated within a tick, read or not
        return out

    def _look(self, name: str, now: float) -> Event | None:
        w = self._engines.get(name)
        if w is None:
            w = self._engines[name] = _Watch()
        info, p = self.view.engine(name), self.view.progress(name)
        if info is None or p is None or info.up is not True:
            # down or never answered: its own state, not a wedge (a restart starts afresh)
            w.moved_at, w.busy_since, w.stuck_s, w.wedged = None, None, None, None
            return None
        thr = self.thr
        moved = p.step_ts is not None and (w.moved_at is None or p.step_ts > w.moved_at)
        held, busy_from = p.held, p.held_ts
        if not held and p.step_ts is not None and not p.sleeping and not p.paused:
            # it said it holds nothing at its last step; requests its API server accepted since,
            # not ended, are held all the same (a hang in the first step after an idle spell)
            accepted, first = self.view.accepted_since(name, p.step_ts)
            if accepted:
                held, busy_from = accepted, first
        busy = bool(held) and not p.sleeping and not p.paused
        if moved and p.step_ts is not None:
            if w.moved_at is not None and w.busy_since is not None and w.wedged is None:  # a wedge is no pace
                gap = self._gap(w, p.step_ts, p.step, now)
                if gap * thr.pace_factor > thr.floor_s:  # only a gap that could raise the threshold counts
                    w.gaps.append((now, gap))
            w.moved_at, w.step = p.step_ts, p.step
        while w.gaps and w.gaps[0][0] < now - thr.pace_window_s:
            w.gaps.popleft()
        resumed = self._resumed(name, w, now) if moved and w.wedged is not None else None
        if not busy:
            w.busy_since, w.stuck_s = None, None
            return resumed
        if w.busy_since is None:
            w.busy_since = busy_from if busy_from is not None else now
        longest = max((g for _, g in w.gaps), default=None)
        interval = None if p.from_recorder else self.scrape_interval_s
        verdict = judge_wedge(
            held=held, moved_at=w.moved_at, busy_since=w.busy_since, now=now, longest_gap_s=longest, thr=thr, scrape_interval_s=interval
        )
        w.stuck_s = verdict.stuck_s
        if resumed is not None or not verdict.wedged or w.wedged is not None:
            return resumed
        last_step_ts = now - verdict.stuck_s
        ev = Event(
            kind=EventKind.ENGINE_WEDGED,
            ts=now,
            source="detector",
            message=f"{name} wedged: {verdict.reason}",
            severity=Severity.CRITICAL,
            engine=name,
            data={
                "detector": NAME,
                "held": held,
                "last_step": p.step,
                "last_step_ts": last_step_ts,
                "stuck_s": round(verdict.stuck_s, 3),
                "threshold_s": round(verdict.threshold_s, 3),
                "longest_gap_s": None if longest is None else round(longest, 3),
                "from": "recorder" if p.from_recorder else "metrics",
                "reason": verdict.reason,
                "suggested_action": ACTION,
            },
        )
        w.wedged = ev
        return ev

    def _gap(self, w: _Watch, moved_at: float, step: int | None, now: float) -> float:
        """The longest step gap since the last tick, as well as the ticks can tell: one step,
        its whole span; several (the recorder numbers them), their mean, or the time the ticks
        saw no movement before these steps came (a long prefill, then quick steps), whichever
        is longer, never more than the span."""
        start = max(w.moved_at or moved_at, w.busy_since or moved_at)
        span = moved_at - start
        if step is None or w.step is None or step - w.step <= 1:
            return span
        unmoved = now - self.thr.interval_s - start
        return min(span, max(span / (step - w.step), unmoved))

    def _resumed(self, name: str, w: _Watch, now: float) -> Event:
        wedge = w.wedged
        assert wedge is not None and w.moved_at is not None
        stopped = float(wedge.data.get("last_step_ts", wedge.ts))
        stuck = max(0.0, w.moved_at - stopped)
        w.wedged = None
        return Event(
            kind=EventKind.ENGINE_RESUMED,
            ts=now,
            source="detector",
            message=f"{name} stepped again after {stuck:.1f} s stuck (wedged at {wedge.ts:.3f})",
            severity=Severity.INFO,
            engine=name,
            data={
                "detector": NAME,
                "stuck_s": round(stuck, 3),
                "stopped_ts": stopped,
                "resumed_ts": w.moved_at,
                "wedged_ts": wedge.ts,
                "wedged_uid": wedge.uid,
            },
        )
