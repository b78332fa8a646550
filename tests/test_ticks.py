"""The shared ticks: periodic sleeps on one grid of the loop's clock, so that tasks of different
periods wake the loop together."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.ticks import next_tick, sleep_to_tick
from tests.support.loop_wakes import CountingSelector


@given(st.floats(1.0, 1e7), st.sampled_from([0.05, 0.1, 0.25, 0.5, 1.0, 2.0]))
def test_the_next_tick_is_the_next_multiple_of_the_period(now: float, period: float) -> None:
    when = next_tick(now, period)
    assert now < when <= now + period + 1e-6
    assert abs(when / period - round(when / period)) < 1e-6


@given(st.integers(1, 10**6), st.floats(0.001, 0.049))
def test_grids_of_periods_that_divide_one_another_meet_on_the_same_float(second: int, before: float) -> None:
    now = second - before  # just before a whole second: every grid's next tick is that second
    assert {next_tick(now, p) for p in (0.05, 0.1, 0.25, 0.5, 1.0)} == {float(second)}


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError):
        next_tick(10.0, 0.0)


def test_a_period_under_the_rounding_still_moves_on() -> None:
    assert next_tick(100.0, 1e-7) > 100.0


def _loop_waits(sleep: object, periods: list[float], seconds: float) -> tuple[int, int]:
    """How many times the loop went to sleep while tasks of ``periods`` ran for ``seconds``,
    and how many wakes the tasks asked for."""
    selector = CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    asked = [0]

    async def every(period: float, offset: float) -> None:
        await asyncio.sleep(offset)  # tasks start apart, as a service's do
        while True:
            await sleep(period)  # type: ignore[operator]
            asked[0] += 1

    async def main() -> None:
        tasks = [asyncio.create_task(every(p, 0.013 * i)) for i, p in enumerate(periods)]
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return selector.waits, asked[0]


def test_tasks_on_the_shared_ticks_wake_the_loop_together() -> None:
    periods = [0.1, 0.1, 0.2, 0.5, 1.0, 1.0, 1.0, 1.0]
    waits, asked = _loop_waits(sleep_to_tick, periods, 2.0)
    # 2 s of 0.1 s ticks is 20 wakes; the tasks asked for 20 + 20 + 10 + 4 + 4 x 2
    assert asked >= 50
    assert waits <= 20 + 10  # the finest grid, and the starts (staggered on purpose)
    apart, asked_apart = _loop_waits(asyncio.sleep, periods, 2.0)
    assert asked_apart >= 50
    assert apart >= 40  # the same tasks each on their own phase: a wake each
