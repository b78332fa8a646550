"""Named steps: started in declared order, stopped in reverse, a failing stop stops nothing else."""

from __future__ import annotations

import asyncio

import pytest

from collector.components import Components


def steps(log: list[str], *, failing_stop: str = "", failing_start: str = "") -> Components:
    c = Components()
    for name in ("a", "b", "c"):

        def start(name: str = name) -> None:
            if name == failing_start:
                raise RuntimeError(f"{name} cannot start")
            log.append(f"start {name}")

        async def stop(name: str = name) -> None:
            await asyncio.sleep(0)
            log.append(f"stop {name}")
            if name == failing_stop:
                raise RuntimeError(f"{name} cannot stop")

        c.add(name, start=start, stop=stop)
    return c


def test_stopped_in_the_reverse_of_the_declared_order() -> None:
    log: list[str] = []
    c = steps(log)
    assert c.names == ["a", "b", "c"] and c.stop_order == ["c", "b", "a"]
    asyncio.run(c.start())
    asyncio.run(c.stop())
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]
    assert c.stopped == c.stop_order and c.stop_failures == []


def test_a_stop_that_fails_does_not_keep_the_others_from_stopping() -> None:
    log: list[str] = []
    c = steps(log, failing_stop="b")
    asyncio.run(c.start())
    asyncio.run(c.stop())
    assert log[3:] == ["stop c", "stop b", "stop a"]
    assert c.stop_failures == ["b"]


def test_a_start_that_fails_stops_the_started_ones_and_raises() -> None:
    log: list[str] = []
    c = steps(log, failing_start="b")
    with pytest.raises(RuntimeError, match="b cannot start"):
        asyncio.run(c.start())
    assert log == ["start a", "stop a"]  # c never started, b's start failed: neither is stopped


def test_a_name_is_declared_once() -> None:
    c = Components()
    c.add("a")
    with pytest.raises(ValueError):
        c.add("a")
