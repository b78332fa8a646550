"""Throughput collapse: tokens/s fell far below the recent baseline while demand is still there."""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState, mean, median
from collector.detectors.config import ThroughputThresholds
from collector.detectors.series import Point, Sums, window
from collector.model import Severity

NAME = "throughput_collapse"


def detect_throughput_collapse(
    tokens: Sequence[Point], demand: Sequence[Point], *, now: float, labels: dict[str, str], thr: ThroughputThresholds
) -> DetectorState:
    """``tokens``: tokens per step/interval; ``demand``: running + waiting requests."""
    start = now - thr.window_s - thr.baseline_s
    recent_tokens = window(tokens, start)
    if not recent_tokens or recent_tokens[0][0] > now - thr.window_s - thr.baseline_s / 2:
        return DetectorState(NAME, Severity.OK, "not enough history for a baseline", labels=labels, ts=now)
    sums = Sums(recent_tokens)
    current = sums.between(now - thr.window_s, now) / thr.window_s
    # the baseline: the median of the window-long rates before the current window
    rates = []
    end = now - thr.window_s
    while end - thr.window_s >= recent_tokens[0][0] - 1e-9:
        rates.append(sums.between(end - thr.window_s, end) / thr.window_s)
        end -= thr.window_s
    baseline = median(rates) or 0.0
    if baseline < thr.min_baseline_tokens_per_s:
        return DetectorState(NAME, Severity.OK, f"baseline {baseline:.1f} tokens/s too low to judge", labels=labels, ts=now, value=current)
    demand_now = mean(v for _, v in window(demand, now - thr.window_s)) or 0.0
    demand_before = mean(v for t, v in window(demand, start) if t <= now - thr.window_s) or 0.0
    if demand_now <= 0 or demand_now < thr.min_load_ratio * demand_before:
        return DetectorState(NAME, Severity.OK, "demand fell with throughput", labels=labels, ts=now, value=current / baseline)
    ratio = current / baseline
    if ratio <= thr.critical_ratio:
        level = Severity.CRITICAL
    elif ratio <= thr.warning_ratio:
        level = Severity.WARNING
    else:
        return DetectorState(NAME, Severity.OK, f"{current:.0f} tokens/s, {ratio:.0%} of baseline", labels=labels, ts=now, value=ratio)
    return DetectorState(
        NAME,
        level,
        f"{current:.1f} tokens/s is {ratio:.0%} of the {baseline:.1f} tokens/s baseline with {demand_now:.0f} requests in the engine",
        "look for preemptions, KV-transfer waits or GPU throttling at the same time; take a snapshot",
        ratio,
        labels,
        now,
    )
