"""The wedge's threshold and verdict (pure): the engine's own pace within the floor and the ceiling."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from collector.detectors.config import WedgeThresholds
from collector.detectors.wedge import judge_wedge, threshold_s

THR = WedgeThresholds()  # floor 10 s, ceiling 120 s, 4 x the longest recent gap


@pytest.mark.parametrize(
    ("longest_gap", "scrape_interval", "expected"),
    [
        (None, None, 10.0),  # no long gap seen: the floor
        (0.5, None, 10.0),  # a fast engine: the floor
        (8.0, None, 32.0),  # 8 s prefill chunks are its pace: 4 x 8
        (60.0, None, 120.0),  # never over the ceiling
        (None, 5.0, 15.0),  # seen through /metrics every 5 s: three scrapes at least
    ],
)
def test_the_threshold_follows_the_engines_pace_within_floor_and_ceiling(
    longest_gap: float | None, scrape_interval: float | None, expected: float
) -> None:
    assert threshold_s(longest_gap, THR, scrape_interval_s=scrape_interval) == pytest.approx(expected)


def test_a_ceiling_below_the_floor_is_refused() -> None:
    with pytest.raises(ValidationError, match="ceiling_s"):
        WedgeThresholds(floor_s=30, ceiling_s=20)


def test_requests_held_and_no_step_past_the_threshold_is_a_wedge() -> None:
    v = judge_wedge(held=8, moved_at=100.0, busy_since=50.0, now=111.0, longest_gap_s=None, thr=THR)
    assert v.wedged and v.stuck_s == pytest.approx(11.0)
    assert "8 requests held" in v.reason and "floor 10 s" in v.reason


def test_short_of_the_threshold_is_not() -> None:
    v = judge_wedge(held=8, moved_at=100.0, busy_since=50.0, now=109.0, longest_gap_s=None, thr=THR)
    assert not v.wedged and v.stuck_s == pytest.approx(9.0)


def test_a_slow_prefill_seen_before_raises_the_threshold() -> None:
    v = judge_wedge(held=1, moved_at=100.0, busy_since=50.0, now=125.0, longest_gap_s=8.0, thr=THR)
    assert not v.wedged and v.threshold_s == pytest.approx(32.0)


def test_an_idle_engine_is_never_wedged() -> None:
    for held in (0, None):
        v = judge_wedge(held=held, moved_at=0.0, busy_since=None, now=10_000.0, longest_gap_s=None, thr=THR)
        assert not v.wedged and v.stuck_s == 0.0


def test_the_clock_starts_when_it_took_requests_not_at_its_last_idle_step() -> None:
    # idle since 0 s, requests held from 1000 s: not wedged at 1005 s although its last step is old
    v = judge_wedge(held=2, moved_at=0.0, busy_since=1000.0, now=1005.0, longest_gap_s=None, thr=THR)
    assert not v.wedged and v.stuck_s == pytest.approx(5.0)
