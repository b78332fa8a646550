from __future__ import annotations

import pytest

from collector.detectors.config import StallThresholds
from collector.detectors.stall import detect_stall
from collector.model import Severity

THR = StallThresholds(warning_after_s=10, critical_after_s=30)
L = {"engine": "decode-0"}


@pytest.mark.parametrize(
    ("waiting", "tokens", "now", "expected"),
    [
        # tokens flow: no stall even with a queue
        ([(t, 5.0) for t in range(60)], [(t, 8.0) for t in range(60)], 60.0, Severity.OK),
        # nothing waiting, nothing computed: idle, not stalled
        ([(t, 0.0) for t in range(60)], [(t, 0.0) for t in range(60)], 60.0, Severity.OK),
        # waiting, last token 15 s ago
        ([(t, 3.0) for t in range(60)], [(t, 8.0 if t < 45 else 0.0) for t in range(60)], 59.5, Severity.WARNING),
        # the engine stopped stepping 40 s ago: measured to now, not to the last record
        ([(t, 3.0) for t in range(20)], [(t, 8.0) for t in range(20)], 59.0, Severity.CRITICAL),
        # waiting from the start, never a token, only 5 s of data
        ([(t, 3.0) for t in range(5)], [(t, 0.0) for t in range(5)], 5.0, Severity.OK),
    ],
)
def test_stall(waiting, tokens, now, expected) -> None:
    state = detect_stall(waiting, tokens, now=now, labels=L, thr=THR)
    assert state.state is expected
    if expected is not Severity.OK:
        assert "waiting" in state.reason and state.suggested_action
        assert state.value is not None and state.value >= THR.warning_after_s
