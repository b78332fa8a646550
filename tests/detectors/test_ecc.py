from __future__ import annotations

import pytest
from detector_synth import gpu

from collector.detectors.base import Level
from collector.detectors.config import EccThresholds
from collector.detectors.ecc import detect_memory_errors

THR = EccThresholds(window_s=600)
L = {"gpu": "0000:00:06.0"}


@pytest.mark.parametrize(
    ("field", "values", "expected"),
    [
        ("ecc_volatile_uncorrected", [0, 0, 0], Level.OK),
        ("ecc_volatile_uncorrected", [0, 0, 2], Level.CRITICAL),
        ("remapped_rows_uncorrectable", [1, 1, 2], Level.CRITICAL),
        ("remapped_rows_correctable", [3, 4, 4], Level.WARNING),
        ("remapped_rows_correctable", [None, None, 4], Level.OK),  # first reading is not an increase
    ],
)
def test_increases(field: str, values: list, expected: Level) -> None:
    samples = [gpu(100.0 + i, **{field: v}) for i, v in enumerate(values)]
    assert detect_memory_errors(samples, now=103.0, labels=L, thr=THR).state is expected


def test_an_increase_stays_raised_for_the_window_then_clears() -> None:
    samples = [gpu(float(t), ecc_volatile_uncorrected=0 if t < 10 else 1) for t in range(0, 1000, 5)]
    assert detect_memory_errors(samples, now=500.0, labels=L, thr=THR).state is Level.CRITICAL
    assert detect_memory_errors(samples, now=900.0, labels=L, thr=THR).state is Level.OK


def test_pending_remap_warns() -> None:
    samples = [gpu(1.0, remapped_rows_pending=True)]
    assert detect_memory_errors(samples, now=1.0, labels=L, thr=THR).state is Level.WARNING
