from __future__ import annotations

import pytest

from collector.detectors.config import PreemptionThresholds
from collector.detectors.preemption import detect_preemption_storm
from collector.model import Severity

THR = PreemptionThresholds(window_s=10, warning_per_s=0.5, critical_per_s=5)
L = {"engine": "decode-0"}


@pytest.mark.parametrize(
    ("per_step", "expected"),
    [(0, Severity.OK), (0.2, Severity.OK), (1, Severity.WARNING), (6, Severity.CRITICAL)],
)
def test_rate_levels(per_step: float, expected: Severity) -> None:
    # one step per second for a minute
    preemptions = [(float(t), per_step) for t in range(60)]
    state = detect_preemption_storm(preemptions, now=59.0, labels=L, thr=THR)
    assert state.state is expected
    assert state.value == pytest.approx(per_step, rel=0.11)


def test_old_preemptions_leave_the_window() -> None:
    preemptions = [(float(t), 10.0 if t < 20 else 0.0) for t in range(60)]
    assert detect_preemption_storm(preemptions, now=20, labels=L, thr=THR).state is Severity.CRITICAL
    assert detect_preemption_storm(preemptions, now=31, labels=L, thr=THR).state is Severity.OK
