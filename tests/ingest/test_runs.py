"""Runs of one engine: which ring a step of a run goes to."""

from __future__ import annotations

import pytest

from collector.ingest.runs import PreviousRun, newer, window_for
from collector.ingest.window import StepWindow

T0 = 1_765_000_000_000  # run ids that are start times (ms)


def prev(run: int) -> PreviousRun:
    return PreviousRun(run, StepWindow("d", 4), 0.0)


@pytest.mark.parametrize(
    ("current", "previous", "run", "where"),
    [
        (None, None, T0, "current"),  # the first step
        (T0, None, T0, "current"),
        (T0, None, T0 + 5, "new"),  # a later start: a new run
        (T0 + 5, None, T0, "previous"),  # an earlier start read late (a catch-up): the previous run
        (T0 + 5, prev(T0), T0, "previous"),
        (T0 + 5, prev(T0 + 1), T0, "none"),  # older than both held
        (T0 + 5, prev(T0), T0 + 2, "previous"),  # between the two: replaces the previous run
        (4242, None, 4243, "new"),  # pids (recorders before the run id): arrival order
        (4243, prev(4242), 4242, "previous"),
        (4243, prev(4242), 17, "new"),
    ],
)
def test_where_a_step_goes(current: int | None, previous: PreviousRun | None, run: int, where: str) -> None:
    assert window_for(current, previous, run) == where


def test_start_times_compare_as_times_and_pids_by_arrival() -> None:
    assert newer(T0 + 1, T0) and not newer(T0, T0 + 1)
    assert newer(5, 9) and newer(T0, 9) and newer(9, T0)
