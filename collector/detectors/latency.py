"""Inter-token latency regression: the recent mean ITL is a multiple of the baseline's.

Reads vLLM's histogram ``vllm:inter_token_latency_seconds`` through its cumulative _sum and
_count, so the means are exact (no bucket interpolation).
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState
from collector.detectors.config import LatencyThresholds
from collector.detectors.series import Point, value_at
from collector.model import Severity

NAME = "itl_regression"


def _mean_between(sums: Sequence[Point], counts: Sequence[Point], start: float, end: float) -> tuple[float, float]:
    s0, s1 = value_at(sums, start), value_at(sums, end)
    c0, c1 = value_at(counts, start), value_at(counts, end)
    if None in (s0, s1, c0, c1) or c1 < c0:  # type: ignore[operator]
        return 0.0, 0.0
    count = c1 - c0  # type: ignore[operator]
    return ((s1 - s0) / count if count > 0 else 0.0), count  # type: ignore[operator]


def detect_itl_regression(
    itl_sum: Sequence[Point],
    itl_count: Sequence[Point],
    *,
    now: float,
    labels: dict[str, str],
    thr: LatencyThresholds,
) -> DetectorState:
    """``itl_sum``/``itl_count``: the cumulative histogram sum (seconds) and count."""
    if not itl_count or itl_count[0][0] > now - thr.window_s - thr.baseline_s / 2:
        return DetectorState(NAME, Severity.OK, "not enough history for a baseline", labels=labels, ts=now)
    current, n_now = _mean_between(itl_sum, itl_count, now - thr.window_s, now)
    baseline, n_base = _mean_between(itl_sum, itl_count, now - thr.window_s - thr.baseline_s, now - thr.window_s)
    if n_now < thr.min_count or n_base < thr.min_count or baseline <= 0:
        return DetectorState(NAME, Severity.OK, "too few tokens to compare", labels=labels, ts=now)
    ratio = current / baseline
    if ratio >= thr.critical_ratio:
        level = Severity.CRITICAL
    elif ratio >= thr.warning_ratio:
        level = Severity.WARNING
    else:
        return DetectorState(NAME, Severity.OK, f"ITL {current * 1000:.1f} ms, x{ratio:.2f} baseline", labels=labels, ts=now, value=ratio)
    return DetectorState(
        NAME,
        level,
        f"mean inter-token latency {current * 1000:.1f} ms is x{ratio:.1f} the {baseline * 1000:.1f} ms baseline",
        "check batch size and preemptions, GPU clocks (throttling) and KV-transfer times",
        ratio,
        labels,
        now,
    )
