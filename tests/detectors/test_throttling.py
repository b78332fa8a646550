from __future__ import annotations

import pytest
from detector_synth import gpu

from collector.detectors.base import Level
from collector.detectors.config import ThrottlingThresholds
from collector.detectors.throttling import detect_throttling

THR = ThrottlingThresholds()
L = {"gpu": "0000:00:06.0"}


@pytest.mark.parametrize(
    ("reasons", "temp", "previous", "expected"),
    [
        (0x0, 60.0, Level.OK, Level.OK),
        (0x1, 40.0, Level.OK, Level.OK),  # idle
        (0x4, 70.0, Level.OK, Level.OK),  # SW power cap at full load is normal
        (0x20, 80.0, Level.OK, Level.WARNING),  # SW thermal slowdown
        (0x40, 80.0, Level.OK, Level.CRITICAL),  # HW thermal slowdown
        (0x80, 60.0, Level.OK, Level.CRITICAL),  # HW power brake
        (0x0, 86.0, Level.OK, Level.WARNING),
        (0x0, 93.0, Level.OK, Level.CRITICAL),
        (0x0, 83.0, Level.WARNING, Level.WARNING),  # between exit and entry thresholds: stays
        (0x0, 79.0, Level.WARNING, Level.OK),
        (0x0, 89.0, Level.CRITICAL, Level.CRITICAL),
    ],
)
def test_throttling(reasons: int, temp: float, previous: Level, expected: Level) -> None:
    state = detect_throttling(gpu(1.0, clock_event_reasons=reasons, temperature=temp), previous=previous, now=1.0,
                              labels=L, thr=THR)
    assert state.state is expected


def test_reasons_are_named() -> None:
    state = detect_throttling(gpu(1.0, clock_event_reasons=0x48), previous=Level.OK, now=1.0, labels=L, thr=THR)
    assert "hw_slowdown" in state.reason and "hw_thermal_slowdown" in state.reason
