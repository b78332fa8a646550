"""The table of sources: one builder per source, each taking the settings and returning the
sources it asks for (none when the source is off). The service supervises whatever these
return; adding a source is one line here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from collector.settings import Settings


def _metrics(settings: Settings) -> list[Any]:
    from collector.sources.vllm_metrics import VllmMetricsSource

    if not settings.engines:
        return []
    return [
        VllmMetricsSource(
            engines=settings.engines,
            interval=settings.scrape_interval,
            timeout=settings.scrape_timeout,
            health_fail_threshold=settings.health_fail_threshold,
        )
    ]


def _nvml(settings: Settings) -> list[Any]:
    from collector.sources.nvml import nvml_source_from_setting

    src = nvml_source_from_setting(
        settings.nvml,
        interval=settings.gpu_poll_interval,
        pcie_interval=settings.pcie_interval,
        lost_retry_interval=settings.gpu_lost_retry,
        event_timeout_ms=settings.event_timeout_ms,
        xid_events=settings.xid_events,
    )
    return [src] if src is not None else []


def _kmsg(settings: Settings) -> list[Any]:
    from collector.sources.kmsg import kmsg_source_from_setting

    src = kmsg_source_from_setting(settings.kmsg, from_start=settings.kmsg_from_start, poll_interval=settings.kmsg_poll_interval)
    return [src] if src is not None else []


def _engine_logs(settings: Settings) -> list[Any]:
    import sys

    from collector.sources.engine_log import EngineLogSource

    out: list[Any] = []
    s = settings
    for eng in settings.engines:
        if eng.log == "-":
            out.append(
                EngineLogSource(
                    eng.name,
                    None,
                    stream=sys.stdin.buffer,
                    from_start=s.log_from_start,
                    poll_interval=s.log_poll_interval,
                    idle_flush=s.log_idle_flush,
                    keep=s.log_keep,
                )
            )
        elif eng.log:
            out.append(
                EngineLogSource(
                    eng.name,
                    Path(eng.log),
                    from_start=s.log_from_start,
                    poll_interval=s.log_poll_interval,
                    idle_flush=s.log_idle_flush,
                    keep=s.log_keep,
                )
            )
    return out


def _recorder(settings: Settings) -> list[Any]:
    from collector.sources.recorder import RecorderSource

    if settings.recorder == "off":
        return []
    from collector.sources.join import EngineJoin

    return [RecorderSource(settings.recorder_dir, join=EngineJoin(settings.engines), join_wait=settings.recorder_join_wait)]


SOURCES: list[tuple[str, Callable[[Settings], list[Any]]]] = [
    ("recorder", _recorder),
    ("vllm_metrics", _metrics),
    ("engine_log", _engine_logs),
    ("kmsg", _kmsg),
    ("nvml", _nvml),
]
