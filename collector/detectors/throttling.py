"""GPU thermal or power throttling, from NVML's clock-event reasons and the temperature."""

from __future__ import annotations

from collector.detectors.base import DetectorState
from collector.detectors.config import ThrottlingThresholds
from collector.model import GpuSample, Severity

NAME = "gpu_throttling"

REASON_NAMES = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake",
}


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASON_NAMES.items() if mask & bit]


def detect_throttling(
    sample: GpuSample | None, *, previous: Severity, now: float, labels: dict[str, str], thr: ThrottlingThresholds
) -> DetectorState:
    """``previous``: the published level, so that temperature leaves a level only below its exit margin."""
    if sample is None:
        return DetectorState(NAME, Severity.OK, "no GPU sample", labels=labels, ts=now)
    mask = sample.clock_event_reasons or 0
    temp = sample.temperature
    reasons: list[str] = []
    level = Severity.OK
    if mask & thr.critical_reasons:
        level = Severity.CRITICAL
        reasons += reason_names(mask & thr.critical_reasons)
    elif mask & thr.warning_reasons:
        level = Severity.WARNING
        reasons += reason_names(mask & thr.warning_reasons)
    if temp is not None:
        margin = thr.temperature_exit_margin_c
        crit = thr.temperature_critical_c - (margin if previous is Severity.CRITICAL else 0.0)
        warn = thr.temperature_warning_c - (margin if previous.rank >= Severity.WARNING.rank else 0.0)
        if temp >= crit:
            level = Severity.CRITICAL
            reasons.append(f"temperature {temp:.0f}C")
        elif temp >= warn:
            level = max(level, Severity.WARNING, key=lambda lv: lv.rank)
            reasons.append(f"temperature {temp:.0f}C")
    if level is Severity.OK:
        return DetectorState(NAME, Severity.OK, "no throttling", labels=labels, ts=now, value=temp)
    return DetectorState(
        NAME,
        level,
        "GPU throttled: " + ", ".join(reasons),
        "check cooling and power delivery of this GPU; expect lower throughput until it clears",
        temp,
        labels,
        now,
    )
