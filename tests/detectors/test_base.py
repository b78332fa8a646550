"""Hysteresis: enter after N bad evaluations, leave after M good ones, never flap on noise."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.detectors.base import Hysteresis
from collector.model import Severity

OK, W, C = Severity.OK, Severity.WARNING, Severity.CRITICAL


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([W, OK, W, OK, W, OK], [OK] * 6),  # alternating noise never enters
        ([W, W, OK, W], [OK, W, W, W]),  # one good evaluation does not leave
        ([W, W, OK, OK, OK], [OK, W, W, W, OK]),
        ([C, W], [OK, W]),  # the mildest level of the streak is entered
        ([C, C, W, W, W], [OK, C, C, C, W]),
    ],
)
def test_sequences(raw: list[Severity], expected: list[Severity]) -> None:
    gate = Hysteresis(enter_after=2, exit_after=3)
    assert [gate.update(level) for level in raw] == expected


@given(st.lists(st.sampled_from([OK, W, C]), max_size=200), st.integers(1, 5), st.integers(1, 5))
def test_published_changes_are_never_more_than_streaks_allow(raw: list[Severity], enter: int, leave: int) -> None:
    gate = Hysteresis(enter_after=enter, exit_after=leave)
    out = [gate.update(level) for level in raw]
    changes = sum(1 for a, b in zip([OK] + out, out, strict=False) if a is not b)
    assert changes <= len(raw) // min(enter, leave)
    for i, level in enumerate(out):
        if level is not OK:
            # a published bad level was preceded by at least `enter` raw bad evaluations
            assert any(all(r.rank >= 1 for r in raw[j - enter + 1 : j + 1]) for j in range(enter - 1, i + 1))


def test_random_noise_around_a_threshold_flaps_rarely() -> None:
    rng = random.Random(7)
    gate = Hysteresis(enter_after=3, exit_after=5)
    raw = [W if rng.random() < 0.2 else OK for _ in range(1000)]
    out = [gate.update(level) for level in raw]
    changes = sum(1 for a, b in zip(out, out[1:], strict=False) if a is not b)
    assert changes <= 20
