"""The sidecar's own long-running tasks (writer, snapshot committer, detectors, alert router,
retention, heartbeat), each run under a supervisor: a task that raises is logged with its
traceback and restarted after a backoff (0.5 s doubling to 30 s, back to 0.5 s after a minute
of good running), so one bug costs a restart, never a dead stage behind an ``ok`` /healthz.
Sources have their own supervisor (``collector.sources.supervisor``); this is its twin for
the stages.

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


@dataclass
class TaskStatus:
    name: str
    up: bool = False
    restarts: int = 0
    last_error: str | None = None  # the last failure, kept after a restart (null: never failed)
    since: float | None = None  # epoch seconds: when it last started (up) or failed (down)
    done: bool = False  # a task with an end (the late migration) that reached it


class SupervisedTask:
    def __init__(self, name: str, factory: Callable[[], Awaitable[None]], *, once: bool = False,
                 min_backoff: float = MIN_BACKOFF_S, max_backoff: float = MAX_BACKOFF_S,
                 healthy_after: float = HEALTHY_AFTER_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        """``factory`` makes a fresh coroutine per start. ``once``: returning means done; for
        the others (loops that never end) a return is a failure and is restarted too."""
        self.factory = factory
        self.once = once
        self.min_backoff, self.max_backoff, self.healthy_after = min_backoff, max_backoff, healthy_after
        self._sleep, self._clock = sleep, clock
        self.status = TaskStatus(name=name)

    @property
    def name(self) -> str:
        return self.status.name

    async def run(self) -> None:
        st = self.status
        backoff = self.min_backoff
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
                if self._clock() - started > self.healthy_after:
                    backoff = self.min_backoff
                log.error("task %s failed (%s); restarting in %.1fs", st.name, st.last_error, backoff, exc_info=exc)
            await self._sleep(backoff)
            st.restarts += 1
            backoff = min(backoff * 2, self.max_backoff)


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
