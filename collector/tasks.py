"""Internal: The sidecar's own long-running tasks (writer, snapshot committer, detectors, alert router,
retention, heartbeat), each run under a supervisor: a task that raises is logged with its
traceback and restarted after a backoff (0.5 s doubling to 30 s, back to 0.5 s after a minute
of good running), so one bug costs a restart, never a dead stage behind an ``ok`` /healthz.
Sources have their own supervisor (``collector.sources.supervisor``: a source may also report
itself unsupported, and keeps its own statuses); both restart by the same ``Backoff``.

Each task's state is data: ``up``, ``restarts``, ``last_error`` and ``since`` (when it last
started, or failed), read by /healthz and ``flightrec_task_up`` /
``flightrec_task_restarts_total``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0  # a task that ran this long before failing restarts at the shortest backoff


class Backoff:
    """The restart policy both supervisors share (this one and ``collector.sources.supervisor``):
    ``min_s`` doubling to ``max_s``, back to ``min_s`` after a run of ``healthy_after`` s."""

    def __init__(self, min_s: float = MIN_BACKOFF_S, max_s: float = MAX_BACKOFF_S, healthy_after: float = HEALTHY_AFTER_S) -> None:
        self.min_s, self.max_s, self.healthy_after = min_s, max_s, healthy_after
        self.current = min_s

    def after_failure(self, ran_for: float) -> float:
        """The wait before the next start, for a run that lasted ``ran_for`` seconds."""
        if ran_for > self.healthy_after:
            self.current = self.min_s
        wait = self.current
        self.current = min(self.current * 2, self.max_s)
        return wait


@dataclass
class TaskStatus:
    name: str
    up: bool = False
    restarts: int = 0
    last_error: str | None = None  # the last failure, kept after a restart (null: never failed)
    since: float | None = None  # epoch seconds: when it last started (up) or failed (down)
    done: bool = False  # a task with an end (the late migration) that reached it


class SupervisedTask:
    def __init__(
        self,
        name: str,
        factory: Callable[[], Awaitable[None]],
        *,
        once: bool = False,
        min_backoff: float = MIN_BACKOFF_S,
        max_backoff: float = MAX_BACKOFF_S,
        healthy_after: float = HEALTHY_AFTER_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``factory`` makes a fresh coroutine per start. ``once``: returning means done; for
        the others (loops that never end) a return is a failure and is restarted too."""
        self.factory = factory
        self.once = once
        self.backoff = Backoff(min_backoff, max_backoff, healthy_after)
        self._sleep, self._clock = sleep, clock
        self.status = TaskStatus(name=name)

    @property
    def name(self) -> str:
        return self.status.name

    async def run(self) -> None:
        st = self.status
        while True:
            started = self._clock()
            st.up, st.since = True, time.time()
            try:
                await self.factory()
                if self.once:
                    st.up, st.done = False, True
                    return
                raise RuntimeError("returned, though it should run until stopped")
            except asyncio.CancelledError:
                st.up = False
                raise
            except Exception as exc:
                st.up, st.since = False, time.time()
                st.last_error = f"{type(exc).__name__}: {exc}"[:500]
                wait = self.backoff.after_failure(self._clock() - started)
                log.error("task %s failed (%s); restarting in %.1fs", st.name, st.last_error, wait, exc_info=exc)
            await self._sleep(wait)
            st.restarts += 1


class TaskSet:
    """The service's supervised tasks, in start order, for /healthz and /metrics."""

    def __init__(self) -> None:
        self.supervised: list[SupervisedTask] = []

    def start(self, name: str, factory: Callable[[], Awaitable[None]], *, once: bool = False) -> asyncio.Task[None]:
        sup = SupervisedTask(name, factory, once=once)
        self.supervised.append(sup)
        return asyncio.create_task(sup.run(), name=name)

    def statuses(self) -> list[TaskStatus]:
        return [s.status for s in self.supervised]

    def failing(self) -> list[str]:
        return [s.name for s in self.statuses() if not s.up and not s.done]
