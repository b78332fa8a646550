"""The engine-log source's settings (``collector.sources.engine_log``), mounted flat in
``Settings``; the path of each log is ``engines[i].log``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

DEFAULT_POLL_INTERVAL = 0.1  # on the loop's shared ticks (collector.ticks), with the recorder's poll
DEFAULT_IDLE_FLUSH = 0.2


class EngineLogSettings(BaseModel):
    log_from_start: bool = Field(default=False, description="read existing engine logs from their start")
    log_poll_interval: float = Field(default=DEFAULT_POLL_INTERVAL, gt=0)
    log_idle_flush: float = Field(default=DEFAULT_IDLE_FLUSH, gt=0, description="a quiet traceback is complete after this")
    log_keep: Literal["important", "all"] = "important"
