"""The in-engine recorder: code that runs inside vLLM, never in the sidecar.

- ``collector.vllm.plugin.FlightRecorderStatLogger``: the stat-logger plugin (entry point
  ``vllm.stat_logger_plugins``), loaded by vLLM once this package is installed.
- ``collector.vllm.RecordingScheduler``: opt-in per-request recording,
  ``--scheduler-cls collector.vllm.RecordingScheduler``.

Both import vLLM, so they are loaded lazily: importing ``collector.vllm`` alone imports nothing
of vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RecordingScheduler"]


def __getattr__(name: str) -> Any:
    if name == "RecordingScheduler":
        from collector.vllm.scheduler import RecordingScheduler  # noqa: PLC0415

        return RecordingScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
