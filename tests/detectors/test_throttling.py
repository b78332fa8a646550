from __future__ import annotations

import pytest
from detector_synth import gpu

from collector.detectors.config import ThrottlingThresholds
from collector.detectors.throttling import detect_throttling
from collector.model import Severity

THR = ThrottlingThresholds()
L = {"gpu": "0000:00:06.0"}


@pytest.mark.parametrize(
    ("reasons", "temp", "previous", "expected"),
    [
        (0x0, 60.0, Severity.OK, Severity.OK),
        (0x1, 40.0, Severity.OK, Severity.OK),  # idle
        (0x4, 70.0, Severity.OK, Severity.OK),  # SW power cap at full load is normal
        (0x20, 80.0, Severity.OK, Severity.WARNING),  # SW thermal slowdown
        (0x40, 80.0, Severity.OK, Severity.CRITICAL),  # HW thermal slowdown
        (0x80, 60.0, Severity.OK, Severity.CRITICAL),  # HW power brake
        (0x0, 86.0, Severity.OK, Severity.WARNING),
        (0x0, 93.0, Severity.OK, Severity.CRITICAL),
        (0x0, 83.0, Severity.WARNING, Severity.WARNING),  # between exit and entry thresholds: stays
        (0x0, 79.0, Severity.WARNING, Severity.OK),
        (0x0, 89.0, Severity.CRITICAL, Severity.CRITICAL),
    ],
)
def test_throttling(reasons: int, temp: float, previous: Severity, expected: Severity) -> None:
    state = detect_throttling(gpu(1.0, clock_event_reasons=reasons, temperature=temp), previous=previous, now=1.0, labels=L, thr=THR)
    assert state.state is expected


def test_reasons_are_named() -> None:
    state = detect_throttling(gpu(1.0, clock_event_reasons=0x48), previous=Severity.OK, now=1.0, labels=L, thr=THR)
    assert "hw_slowdown" in state.reason and "hw_thermal_slowdown" in state.reason
