"""Engine stall: requests are waiting, yet no token has been computed for a while.

The engine may have stopped stepping entirely (a hang records no steps at all), so the
time since the last progress is measured to ``now``, not to the last record.
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState
from collector.detectors.config import StallThresholds
from collector.detectors.series import Point
from collector.model import Severity

NAME = "engine_stall"


def detect_stall(waiting: Sequence[Point], tokens: Sequence[Point], *, now: float, labels: dict[str, str], thr: StallThresholds) -> DetectorState:
    """``waiting``: the waiting-requests gauge; ``tokens``: tokens computed per step/interval."""
    if not waiting or waiting[-1][1] <= 0:
        return DetectorState(NAME, Severity.OK, "no request waiting", labels=labels, ts=now, value=0.0)
    first_seen = min(waiting[0][0], tokens[0][0] if tokens else waiting[0][0])
    last_progress = next((t for t, v in reversed(tokens) if v > 0), first_seen)
    idle = now - last_progress
    pending = int(waiting[-1][1])
    if idle >= thr.critical_after_s:
        level = Severity.CRITICAL
    elif idle >= thr.warning_after_s:
        level = Severity.WARNING
    else:
        return DetectorState(NAME, Severity.OK, f"last token {idle:.1f}s ago", labels=labels, ts=now, value=idle)
    return DetectorState(
        NAME,
        level,
        f"{pending} requests waiting and no token computed for {idle:.0f}s",
        "take a snapshot, check the engine log for a hang (NCCL, KV transfer) and py-spy dump the engine core",
        idle,
        labels,
        now,
    )
