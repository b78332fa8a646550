"""Where the GPU gauges come from (``collector.sources.dcgm``), mounted flat in ``Settings``
(``gpu_metrics: dcgm``, ``dcgm_url: ...`` in flightrec.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator


class DcgmSettings(BaseModel):
    gpu_metrics: Literal["nvml", "dcgm"] = Field(
        default="nvml",
        description="nvml: the sidecar polls NVML; dcgm: it reads dcgm-exporter's /metrics, and NVML is used for Xid events only",
    )
    dcgm_url: str = Field(default="http://127.0.0.1:9400/metrics", description="dcgm-exporter's /metrics on this node")
    dcgm_timeout: float = Field(default=2.0, gt=0)

    @field_validator("dcgm_url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v
