from __future__ import annotations

import pytest

from collector.detectors.config import LatencyThresholds
from collector.detectors.latency import detect_itl_regression
from collector.model import Severity

THR = LatencyThresholds(window_s=30, baseline_s=300, min_count=20)
L = {"engine": "decode-0"}


def cumulative(itl_at, seconds=400, tokens_per_s=50):
    sums, counts, s, c = [], [], 0.0, 0
    for t in range(seconds):
        s += itl_at(t) * tokens_per_s
        c += tokens_per_s
        sums.append((float(t), s))
        counts.append((float(t), float(c)))
    return sums, counts


@pytest.mark.parametrize(
    ("after", "expected"),
    [(0.02, Severity.OK), (0.05, Severity.WARNING), (0.1, Severity.CRITICAL)],
)
def test_itl_regression(after: float, expected: Severity) -> None:
    sums, counts = cumulative(lambda t: 0.02 if t < 360 else after)
    state = detect_itl_regression(sums, counts, now=399, labels=L, thr=THR)
    assert state.state is expected
    if expected is not Severity.OK:
        assert state.value == pytest.approx(after / 0.02, rel=0.2)


def test_idle_engine_has_no_verdict() -> None:
    sums, counts = cumulative(lambda t: 0.5, tokens_per_s=0)
    assert detect_itl_regression(sums, counts, now=399, labels=L, thr=THR).state is Severity.OK
