from __future__ import annotations

from collector.detectors.base import Level
from collector.detectors.config import MirrorRowsThresholds
from collector.detectors.mirror_rows import detect_mirror_rows_growth

THR = MirrorRowsThresholds(window_s=60, growth_ratio=1.5, load_tolerance=0.2)
L = {"engine": "decode-0"}


def series(rows, running, seconds=60):
    return [(float(t), float(rows(t))) for t in range(seconds)], [(float(t), float(running(t))) for t in range(seconds)]


def test_rows_doubling_with_steady_load_warns() -> None:
    rows, running = series(lambda t: 1000 + 30 * t, lambda t: 8 + (t % 2))
    state = detect_mirror_rows_growth(rows, running, now=59, labels=L, thr=THR)
    assert state.state is Level.WARNING
    assert state.value is not None and state.value > 1.5


def test_rows_growing_with_the_load_is_fine() -> None:
    rows, running = series(lambda t: 1000 + 30 * t, lambda t: 4 + t // 8)
    assert detect_mirror_rows_growth(rows, running, now=59, labels=L, thr=THR).state is Level.OK


def test_steady_rows_are_fine() -> None:
    rows, running = series(lambda t: 1000 + (t % 5) * 20, lambda t: 8)
    assert detect_mirror_rows_growth(rows, running, now=59, labels=L, thr=THR).state is Level.OK


def test_too_few_points_is_ok() -> None:
    rows, running = series(lambda t: 1000 * t, lambda t: 8, seconds=4)
    assert detect_mirror_rows_growth(rows, running, now=4, labels=L, thr=THR).state is Level.OK
