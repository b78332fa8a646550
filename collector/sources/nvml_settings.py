"""The NVML source's settings (``collector.sources.nvml``), mounted flat in ``Settings``
(``nvml: auto``, ``gpu_poll_interval: 1.0`` in flightrec.yaml)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

DEFAULT_INTERVAL = 1.0
DEFAULT_PCIE_INTERVAL = 30.0
DEFAULT_LOST_RETRY = 30.0
DEFAULT_EVENT_TIMEOUT_MS = 1000


class NvmlSettings(BaseModel):
    nvml: Literal["auto", "on", "off"] = "auto"
    gpu_poll_interval: float = Field(default=DEFAULT_INTERVAL, gt=0, description="seconds between GPU samples")
    pcie_interval: float = Field(default=DEFAULT_PCIE_INTERVAL, gt=0, description="PCIe replay is a slow NVML call")
    gpu_lost_retry: float = Field(default=DEFAULT_LOST_RETRY, gt=0, description="seconds between retries of a lost GPU")
    xid_events: bool = Field(default=True, description="listen for NVML Xid events")
    event_timeout_ms: int = Field(default=DEFAULT_EVENT_TIMEOUT_MS, ge=1, le=60_000)

    @field_validator("nvml", mode="before")
    @classmethod
    def _nvml_yaml_boolean(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off`/`on` as a boolean.
        if isinstance(v, bool):
            return "on" if v else "off"
        return v
