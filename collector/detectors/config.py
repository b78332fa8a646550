"""Detector thresholds (mounted by the application settings as ``detectors:``).

Times are seconds; the runner evaluates once a second, so ``enter_after``/``exit_after`` are
also roughly seconds.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator


class StallThresholds(BaseModel):
    enabled: bool = True
    warning_after_s: float = Field(10.0, gt=0)  # waiting > 0 and no token computed for this long
    critical_after_s: float = Field(30.0, gt=0)


class KvJumpThresholds(BaseModel):
    enabled: bool = True
    delta: float = Field(0.3, gt=0, le=1)  # rise of kv_cache_usage (0..1) ...
    window_s: float = Field(5.0, gt=0)  # ... within this long


class PreemptionThresholds(BaseModel):
    enabled: bool = True
    window_s: float = Field(10.0, gt=0)
    warning_per_s: float = Field(1.0, gt=0)
    critical_per_s: float = Field(5.0, gt=0)


class HostBacklogThresholds(BaseModel):
    enabled: bool = True
    window_s: float = Field(60.0, gt=0)
    growth_ratio: float = Field(1.5, gt=1)  # last quarter of the window over its first
    load_tolerance: float = Field(0.2, ge=0)  # running requests may change this much and count as steady
    pending_min: float = Field(64, ge=0)  # pending page transfers below this are never a backlog
    cache_full: float = Field(0.95, gt=0, le=1)  # host_cache_usage_perc at or above this warns
    min_points: int = Field(8, ge=4)


class ThroughputThresholds(BaseModel):
    enabled: bool = True
    window_s: float = Field(10.0, gt=0)
    baseline_s: float = Field(120.0, gt=0)
    warning_ratio: float = Field(0.3, gt=0, lt=1)  # current tokens/s below this share of the baseline
    critical_ratio: float = Field(0.1, gt=0, lt=1)
    min_baseline_tokens_per_s: float = Field(1.0, ge=0)
    min_load_ratio: float = Field(0.5, ge=0)  # demand must still be at least this share of the baseline's


class LatencyThresholds(BaseModel):
    enabled: bool = True
    window_s: float = Field(30.0, gt=0)
    baseline_s: float = Field(300.0, gt=0)
    warning_ratio: float = Field(2.0, gt=1)  # mean inter-token latency over the baseline's
    critical_ratio: float = Field(4.0, gt=1)
    min_count: int = Field(20, ge=1)  # tokens in the window and in the baseline


class ThrottlingThresholds(BaseModel):
    enabled: bool = True
    temperature_warning_c: float = 85.0
    temperature_critical_c: float = 92.0
    temperature_exit_margin_c: float = Field(5.0, ge=0)  # leave a level this far below its threshold
    # NVML clock-event reasons: HW slowdown 0x8 | HW thermal 0x40 | HW power brake 0x80
    critical_reasons: int = 0x8 | 0x40 | 0x80
    # SW thermal slowdown 0x20. SW power cap (0x4) is normal under full load: not included.
    warning_reasons: int = 0x20


class EccThresholds(BaseModel):
    enabled: bool = True
    window_s: float = Field(600.0, gt=0)  # an increase keeps the state raised this long


class ScrapeGoneThresholds(BaseModel):
    enabled: bool = True
    after_s: float = Field(5.0, gt=0)  # no successful scrape of a known engine for this long


class WedgeThresholds(BaseModel):
    """A wedged engine: it holds requests and has not stepped for ``threshold`` seconds, where
    ``threshold = min(ceiling_s, max(floor_s, pace_factor x its longest step gap of the last
    pace_window_s))`` (docs/alerting.md#wedged-engines)."""

    enabled: bool = True
    floor_s: float = Field(10.0, gt=0)  # never wedged sooner than this after its last step
    ceiling_s: float = Field(120.0, gt=0)  # always wedged this long after its last step, whatever its pace
    pace_factor: float = Field(4.0, ge=1)  # times its longest recent step gap (a slow prefill is its pace)
    pace_window_s: float = Field(900.0, gt=0)  # how far back its step gaps count
    interval_s: float = Field(1.0, gt=0)  # how often the watch looks

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.ceiling_s < self.floor_s:
            raise ValueError(f"wedge.ceiling_s ({self.ceiling_s}) is below wedge.floor_s ({self.floor_s})")
        return self


class DetectorThresholds(BaseModel):
    enter_after: int = Field(2, ge=1)  # evaluations in a row before a worse state is published
    exit_after: int = Field(5, ge=1)  # evaluations in a row before a better state is published
    stall: StallThresholds = StallThresholds()
    kv_jump: KvJumpThresholds = KvJumpThresholds()
    preemption: PreemptionThresholds = PreemptionThresholds()
    host_backlog: HostBacklogThresholds = HostBacklogThresholds()
    throughput: ThroughputThresholds = ThroughputThresholds()
    latency: LatencyThresholds = LatencyThresholds()
    throttling: ThrottlingThresholds = ThrottlingThresholds()
    ecc: EccThresholds = EccThresholds()
    scrape_gone: ScrapeGoneThresholds = ScrapeGoneThresholds()
    wedge: WedgeThresholds = WedgeThresholds()
