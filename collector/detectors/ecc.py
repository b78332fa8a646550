"""GPU memory errors: uncorrected ECC or remapped rows went up, or a row remap is pending."""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState
from collector.detectors.config import EccThresholds
from collector.model import GpuSample, Severity

NAME = "gpu_memory_errors"

_CRITICAL_FIELDS = ("ecc_volatile_uncorrected", "remapped_rows_uncorrectable")
_WARNING_FIELDS = ("remapped_rows_correctable",)


def _increase(samples: Sequence[GpuSample], name: str) -> int:
    values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    return int(values[-1] - values[0]) if len(values) >= 2 and values[-1] > values[0] else 0


def detect_memory_errors(samples: Sequence[GpuSample], *, now: float, labels: dict[str, str], thr: EccThresholds) -> DetectorState:
    """``samples``: one GPU's samples, oldest first, covering at least ``window_s`` when available."""
    recent = [s for s in samples if s.ts >= now - thr.window_s]
    # the baseline is the last sample before the window, so an increase right at its start counts
    before = [s for s in samples if s.ts < now - thr.window_s][-1:]
    series = before + recent
    found: list[str] = []
    level = Severity.OK
    for name in _CRITICAL_FIELDS:
        inc = _increase(series, name)
        if inc:
            found.append(f"{name} +{inc}")
            level = Severity.CRITICAL
    for name in _WARNING_FIELDS:
        inc = _increase(series, name)
        if inc:
            found.append(f"{name} +{inc}")
            if level is Severity.OK:
                level = Severity.WARNING
    if recent and recent[-1].remapped_rows_pending:
        found.append("row remap pending (reset the GPU to apply it)")
        if level is Severity.OK:
            level = Severity.WARNING
    if level is Severity.OK:
        return DetectorState(NAME, Severity.OK, "no new memory errors", labels=labels, ts=now)
    return DetectorState(
        NAME,
        level,
        f"GPU memory errors in the last {thr.window_s:g}s: " + ", ".join(found),
        "drain the GPU and reset it; if uncorrectable errors repeat, replace it (see the Xid catalog)",
        float(len(found)),
        labels,
        now,
    )
