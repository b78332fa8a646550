from __future__ import annotations

import pytest
from detector_synth import gpu

from collector.detectors.config import EccThresholds
from collector.detectors.ecc import detect_memory_errors
from collector.model import Severity

THR = EccThresholds(window_s=600)
L = {"gpu": "0000:00:06.0"}


@pytest.mark.parametrize(
    ("field", "values", "expected"),
    [
        ("ecc_volatile_uncorrected", [0, 0, 0], Severity.OK),
        ("ecc_volatile_uncorrected", [0, 0, 2], Severity.CRITICAL),
        ("remapped_rows_uncorrectable", [1, 1, 2], Severity.CRITICAL),
        ("remapped_rows_correctable", [3, 4, 4], Severity.WARNING),
        ("remapped_rows_correctable", [None, None, 4], Severity.OK),  # first reading is not an increase
    ],
)
def test_increases(field: str, values: list, expected: Severity) -> None:
    samples = [gpu(100.0 + i, **{field: v}) for i, v in enumerate(values)]
    assert detect_memory_errors(samples, now=103.0, labels=L, thr=THR).state is expected


def test_an_increase_stays_raised_for_the_window_then_clears() -> None:
    samples = [gpu(float(t), ecc_volatile_uncorrected=0 if t < 10 else 1) for t in range(0, 1000, 5)]
    assert detect_memory_errors(samples, now=500.0, labels=L, thr=THR).state is Severity.CRITICAL
    assert detect_memory_errors(samples, now=900.0, labels=L, thr=THR).state is Severity.OK


def test_pending_remap_warns() -> None:
    samples = [gpu(1.0, remapped_rows_pending=True)]
    assert detect_memory_errors(samples, now=1.0, labels=L, thr=THR).state is Severity.WARNING
