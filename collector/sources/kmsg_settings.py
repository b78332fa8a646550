"""The kernel-log source's settings (``collector.sources.kmsg``), mounted flat in ``Settings``
(``kmsg: auto``, ``kmsg_poll_interval: 0.1`` in flightrec.yaml)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator


class KmsgSettings(BaseModel):
    kmsg: str = Field(default="auto", description="auto | on | off | syslog (the ring through syslog(2)) | a file path to follow")
    kmsg_from_start: bool = False
    kmsg_poll_interval: float = Field(default=0.1, gt=0, description="file follow poll, seconds (on the loop's shared ticks)")

    @field_validator("kmsg", mode="before")
    @classmethod
    def _kmsg_yaml_boolean(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off`/`on` as a boolean.
        if isinstance(v, bool):
            return "on" if v else "off"
        return v

    @field_validator("kmsg")
    @classmethod
    def _kmsg(cls, v: str) -> str:
        if v in ("auto", "on", "off"):
            return v
        if not v.strip():
            raise ValueError("must be auto, on, off or a file path")
        return v
