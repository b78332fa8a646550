"""Internal: named steps with a start and a stop, stopped in the reverse of the order they are
declared in. The sidecar's wiring (``collector.service``) declares its steps here, so its
shutdown order is a list a reader can check, not a consequence of slicing.

Usage::

    steps = Components()
    steps.add("stores", stop=stores.dispose)
    steps.add("writer", start=start_writer, stop=stop_writer)
    await steps.start()   # in declared order; a start that fails stops those started, then raises
    ...
    await steps.stop()    # in reverse; one that fails is logged and the others still stop

A start or a stop is a callable returning None or an awaitable.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Component", "Components", "Step"]

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[object] | None]


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    start: Step | None = None
    stop: Step | None = None


class Components:
    """Steps declared in start order; stopped in reverse, each whatever the others did."""

    def __init__(self) -> None:
        self._declared: list[Component] = []
        self._started: list[Component] = []
        self.stopped: list[str] = []  # the steps ``stop`` stopped, in the order it did
        self.stop_failures: list[str] = []  # the steps whose stop raised, at the last ``stop``

    def add(self, name: str, *, start: Step | None = None, stop: Step | None = None) -> None:
        if any(c.name == name for c in self._declared):
            raise ValueError(f"step {name!r} declared twice")
        self._declared.append(Component(name, start, stop))

    @property
    def names(self) -> list[str]:
        """The declared start order."""
        return [c.name for c in self._declared]

    @property
    def stop_order(self) -> list[str]:
        """The order ``stop`` stops them in: the declared order, reversed."""
        return [c.name for c in reversed(self._declared)]

    async def start(self) -> None:
        for c in self._declared:
            try:
                await _call(c.start)
            except BaseException:
                log.error("step %s did not start: stopping the %d started before it", c.name, len(self._started))
                await self.stop()
                raise
            self._started.append(c)

    async def stop(self) -> None:
        """Stops every started step, newest first; a stop that raises is logged and the next one
        still runs."""
        self.stopped, self.stop_failures = [], []
        while self._started:
            c = self._started.pop()
            self.stopped.append(c.name)
            try:
                await _call(c.stop)
            except Exception:
                log.exception("step %s did not stop cleanly", c.name)
                self.stop_failures.append(c.name)


async def _call(step: Step | None) -> None:
    if step is None:
        return
    result = step()
    if inspect.isawaitable(result):
        await result
