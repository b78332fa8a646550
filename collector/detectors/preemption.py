"""Preemption storm: the engine preempts requests faster than ``warning_per_s``."""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState
from collector.detectors.config import PreemptionThresholds
from collector.detectors.series import Point, sum_between
from collector.model import Severity

NAME = "preemption_storm"


def detect_preemption_storm(preemptions: Sequence[Point], *, now: float, labels: dict[str, str], thr: PreemptionThresholds) -> DetectorState:
    """``preemptions``: preemptions per step (or per scrape interval), stamped at its end."""
    count = sum_between(preemptions, now - thr.window_s, now)
    rate = count / thr.window_s
    if rate >= thr.critical_per_s:
        level = Severity.CRITICAL
    elif rate >= thr.warning_per_s:
        level = Severity.WARNING
    else:
        return DetectorState(NAME, Severity.OK, f"{count:g} preemptions in {thr.window_s:g}s", labels=labels, ts=now, value=rate)
    return DetectorState(
        NAME,
        level,
        f"{count:g} preemptions in the last {thr.window_s:g}s ({rate:.2f}/s)",
        "KV cache too small for the load: lower max_num_seqs or max_num_batched_tokens, or add KV memory",
        rate,
        labels,
        now,
    )
