"""KV-cache usage jump: usage rose by ``delta`` or more within ``window_s``."""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState
from collector.detectors.config import KvJumpThresholds
from collector.detectors.series import Point, window
from collector.model import Severity

NAME = "kv_cache_jump"


def largest_rise(points: Sequence[Point]) -> float:
    """The largest value[j] - min(value[i] for i <= j)."""
    lowest = float("inf")
    rise = 0.0
    for _, v in points:
        lowest = min(lowest, v)
        rise = max(rise, v - lowest)
    return rise


def detect_kv_jump(usage: Sequence[Point], *, now: float, labels: dict[str, str], thr: KvJumpThresholds) -> DetectorState:
    recent = window(usage, now - thr.window_s)
    rise = largest_rise(recent)
    if rise < thr.delta:
        return DetectorState(NAME, Severity.OK, f"rise {rise:.2f} in {thr.window_s:g}s", labels=labels, ts=now, value=rise)
    last = recent[-1][1]
    return DetectorState(
        NAME,
        Severity.WARNING,
        f"kv_cache_usage rose by {rise:.2f} within {thr.window_s:g}s (now {last:.2f})",
        "look for a burst of long prompts or a prefix import; preemptions follow when usage reaches 1.0",
        rise,
        labels,
        now,
    )
