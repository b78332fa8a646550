"""Internal: periodic sleeps on one grid of the event loop's clock, so periodic work shares wakes.

A task that sleeps its period from whenever it woke keeps a phase of its own, and every phase
costs the loop a wake of its own. A wake is not free: on the 2-vCPU VM of BENCHMARKS.md an idle
asyncio loop spends about 170 us of CPU per wake (``bench/bench_wakes.py``), and the sidecar's
periodic tasks (the recorder's poll, each engine's scrape, the heartbeat, the kernel log's mark,
the writer, the detectors, the HTTP server's tick) woke it about 40 times a second at node load.
``sleep_to_tick(period)`` sleeps to the next multiple of ``period`` on the loop's clock instead:
tasks whose periods divide one another wake on the same instants, and asyncio runs every timer
due within its clock's resolution in one pass of the loop, so they cost one wake together.

    while True:
        await sleep_to_tick(1.0)   # at whole seconds of the loop's clock, with the others
        work()
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["BASE_TICK_S", "next_tick", "sleep_to_tick"]

# The shortest period of the sidecar's own periodic work (the recorder's poll): a wait for
# something another thread does (a scrape's GETs) looks again at this grid's instants.
BASE_TICK_S = 0.1


def next_tick(now: float, period: float) -> float:
    """The first multiple of ``period`` after ``now``, rounded to the microsecond so that grids
    of different periods meet on the same float (``10 * 0.1`` is not ``1.0``)."""
    if period <= 0:
        raise ValueError(f"period must be > 0, not {period}")
    when = round((math.floor(now / period) + 1) * period, 6)
    if when <= now:  # rounded back onto now (a period under a microsecond, or a float's edge)
        when = round(when + period, 6)
    return when if when > now else now + period


async def sleep_to_tick(period: float) -> float:
    """Sleep to the next multiple of ``period`` on the running loop's clock; returns that
    instant (the loop's clock), so a caller can tell how late it woke."""
    loop = asyncio.get_running_loop()
    when = next_tick(loop.time(), period)
    done = loop.create_future()
    handle = loop.call_at(when, _wake, done)
    try:
        await done
    finally:
        handle.cancel()
    return when


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
