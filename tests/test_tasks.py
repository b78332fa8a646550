"""The stages' supervisor: a task that raises is restarted after a backoff that doubles to a
cap (never a tight loop) and starts short again after a long good run; its state is data."""

from __future__ import annotations

import asyncio

import pytest

from collector.tasks import SupervisedTask, TaskSet


class FakeTime:
    """A clock that moves only when the supervisor sleeps (and when a task says it ran long)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s
        await asyncio.sleep(0)


def test_a_failing_task_is_restarted_with_doubling_capped_backoff() -> None:
    t = FakeTime()
    runs = 0

    async def boom() -> None:
        nonlocal runs
        runs += 1
        if runs <= 8:
            raise ValueError(f"bad {runs}")
        await asyncio.Event().wait()  # the ninth run works

    sup = SupervisedTask("writer", boom, min_backoff=0.5, max_backoff=4.0, sleep=t.sleep, clock=t.clock)

    async def main() -> None:
        task = asyncio.create_task(sup.run())
        while runs < 9:
            await asyncio.sleep(0)
        assert sup.status.up and sup.status.restarts == 8
        assert sup.status.last_error == "ValueError: bad 8"  # kept after the restart
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert t.slept == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert not sup.status.up  # cancelled: stopped, not restarted


def test_a_long_good_run_resets_the_backoff_and_a_return_is_a_failure() -> None:
    t = FakeTime()
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 4:
            t.now += 120.0  # ran two minutes before failing
            raise OSError("late")
        if runs < 6:
            raise OSError("early")
        # the sixth run returns: a loop that should never end is restarted too
        if runs > 6:
            await asyncio.Event().wait()

    sup = SupervisedTask("detectors", flaky, min_backoff=1.0, max_backoff=30.0, healthy_after=60.0, sleep=t.sleep, clock=t.clock)

    async def main() -> None:
        task = asyncio.create_task(sup.run())
        while runs < 7:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert t.slept == [1.0, 2.0, 4.0, 1.0, 2.0, 4.0]
    assert sup.status.last_error is not None and "returned" in sup.status.last_error


def test_a_task_with_an_end_is_done_not_failing() -> None:
    async def migrate() -> None:
        return None

    async def main() -> TaskSet:
        tasks = TaskSet()
        await tasks.start("migrate", migrate, once=True)
        return tasks

    tasks = asyncio.run(main())
    [st] = tasks.statuses()
    assert st.done and not st.up and st.restarts == 0 and tasks.failing() == []
