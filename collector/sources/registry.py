"""The table of sources: one entry per source, each with its builder (taking the settings and
returning the sources it asks for, none when the source is off) and what an operator loses when
it cannot run here. The service supervises whatever the builders return; adding a source is one
line here.

The builders read the settings through ``SourcesConfig``, the keys they need: this stage imports
nothing of the settings module (which mounts each source's own settings class).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from collector.sources.base import Source
from collector.sources.discovery_settings import DiscoverySettings


class EngineEntry(Protocol):
    """A configured engine, as the sources read it."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def log(self) -> str | None: ...


@dataclass(frozen=True)
class _Engine:
    """An engine the sources were not configured with (a discovered pod's)."""

    name: str
    url: str


class SourcesConfig(Protocol):
    """What the builders read of the settings (``collector.settings.Settings`` fits)."""

    @property
    def engines(self) -> Sequence[EngineEntry]: ...

    @property
    def scrape_interval(self) -> float: ...

    @property
    def scrape_timeout(self) -> float: ...

    @property
    def health_fail_threshold(self) -> int: ...
    @property
    def engine_start_grace_s(self) -> float: ...

    @property
    def recorder(self) -> str: ...

    @property
    def recorder_dir(self) -> Path: ...

    @property
    def recorder_join_wait(self) -> float: ...
    @property
    def recorder_read_s(self) -> float: ...

    # the sources' own settings classes, mounted in the settings
    @property
    def discovery(self) -> DiscoverySettings: ...

    @property
    def gpu_metrics(self) -> str: ...

    @property
    def dcgm_url(self) -> str: ...

    @property
    def dcgm_timeout(self) -> float: ...

    @property
    def nvml(self) -> str: ...

    @property
    def gpu_poll_interval(self) -> float: ...

    @property
    def pcie_interval(self) -> float: ...

    @property
    def gpu_lost_retry(self) -> float: ...

    @property
    def event_timeout_ms(self) -> int: ...

    @property
    def xid_events(self) -> bool: ...

    @property
    def kmsg(self) -> str: ...

    @property
    def kmsg_from_start(self) -> bool: ...

    @property
    def kmsg_poll_interval(self) -> float: ...

    @property
    def log_from_start(self) -> bool: ...

    @property
    def log_poll_interval(self) -> float: ...

    @property
    def log_idle_flush(self) -> float: ...

    @property
    def log_keep(self) -> Literal["important", "all"]: ...


def _metrics(settings: SourcesConfig) -> list[Source]:
    from collector.sources.vllm_metrics import VllmMetricsSource

    if not settings.engines:
        return []
    return [
        VllmMetricsSource(
            engines=settings.engines,
            interval=settings.scrape_interval,
            timeout=settings.scrape_timeout,
            health_fail_threshold=settings.health_fail_threshold,
            start_grace_s=settings.engine_start_grace_s,
        )
    ]


def _nvml(settings: SourcesConfig) -> list[Source]:
    from collector.sources.nvml import nvml_source_from_setting

    src = nvml_source_from_setting(
        settings.nvml,
        interval=settings.gpu_poll_interval,
        pcie_interval=settings.pcie_interval,
        lost_retry_interval=settings.gpu_lost_retry,
        event_timeout_ms=settings.event_timeout_ms,
        xid_events=settings.xid_events,
        gauges=settings.gpu_metrics == "nvml",
    )
    if src is not None and not src.gauges and not src.xid_events:
        return []  # dcgm-exporter gives the gauges and no Xid events are wanted: nothing for NVML to do
    return [src] if src is not None else []


def _dcgm_source(settings: SourcesConfig) -> Any:
    from collector.sources.dcgm import DcgmSource

    if settings.gpu_metrics != "dcgm":
        return None
    return DcgmSource(settings.dcgm_url, interval=settings.gpu_poll_interval, timeout=settings.dcgm_timeout)


def _dcgm(settings: SourcesConfig) -> list[Source]:
    if settings.discovery.mode == "kubernetes":
        return []  # built beside discovery ("recorder" above), which reads its GPU -> pod map
    src = _dcgm_source(settings)
    return [src] if src is not None else []


def _kmsg(settings: SourcesConfig) -> list[Source]:
    from collector.sources.kmsg import kmsg_source_from_setting

    if settings.kmsg == "syslog":  # the same ring through syslog(2): CAP_SYSLOG, no device
        from collector.sources.klog import KlogSource

        return [KlogSource(required=True, from_start=settings.kmsg_from_start, poll_interval=max(settings.kmsg_poll_interval, 0.25))]

    src = kmsg_source_from_setting(settings.kmsg, from_start=settings.kmsg_from_start, poll_interval=settings.kmsg_poll_interval)
    return [src] if src is not None else []


def _engine_logs(settings: SourcesConfig) -> list[Source]:
    import sys

    from collector.sources.engine_log import EngineLogSource

    out: list[Source] = []
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


def _recorder(settings: SourcesConfig) -> list[Source]:
    """The recorder's rings, and the engines Kubernetes discovery finds: one join for both, so
    that a discovered engine's rings join it by name."""
    from collector.sources.join import EngineJoin
    from collector.sources.recorder import RecorderSource

    join = EngineJoin(settings.engines)
    out: list[Source] = []
    if settings.recorder != "off":
        out.append(RecorderSource(settings.recorder_dir, join=join, join_wait=settings.recorder_join_wait, read_every=settings.recorder_read_s))
    if settings.discovery.mode == "kubernetes":
        # which GPUs each discovered engine holds: the kubelet's PodResources API, else
        # dcgm-exporter's GPU -> pod map
        dcgm = _dcgm_source(settings)
        pods = _pod_resources(settings)
        out.append(_discovery(settings, join, dcgm, pods))
        out += [src for src in (pods, dcgm) if src is not None]
    return out


def _pod_resources(settings: SourcesConfig) -> Any:
    from collector.sources.pod_resources import PodResourcesSource

    d = settings.discovery
    if not d.pod_resources:
        return None
    return PodResourcesSource(d.pod_resources_socket, interval=d.pod_resources_interval_s)


def _discovery(settings: SourcesConfig, join: Any, dcgm: Any = None, pod_resources: Any = None) -> Any:
    from collector.parsers.kube_pods import PodEngine
    from collector.sources.discovery import KubernetesDiscovery
    from collector.sources.engine_log import EngineLogSource
    from collector.sources.kube_api import KubeApi
    from collector.sources.vllm_metrics import VllmMetricsSource

    d = settings.discovery
    s = settings

    def metrics(engine: PodEngine) -> Any:
        assert engine.url is not None
        return VllmMetricsSource(
            engines=[_Engine(name=engine.name, url=engine.url)],
            interval=s.scrape_interval,
            timeout=s.scrape_timeout,
            health_fail_threshold=s.health_fail_threshold,
            start_grace_s=s.engine_start_grace_s,
        )

    def logs(engine: PodEngine, from_start: bool) -> Any:
        if not d.follow_logs:
            return None
        return EngineLogSource(
            engine.name,
            d.log_root / engine.log_dir,
            cri=True,
            from_start=from_start or s.log_from_start,
            poll_interval=s.log_poll_interval,
            idle_flush=s.log_idle_flush,
            keep=s.log_keep,
        )

    return KubernetesDiscovery(
        KubeApi(d.api_url, token_file=d.token_file, ca_file=d.ca_file, read_timeout=d.watch_timeout_s + 30.0),
        node=d.node_name,
        label_selector=d.label_selector,
        namespace=d.namespace,
        container=d.container,
        port=d.port,
        metrics_factory=metrics,
        log_factory=logs,
        join=join,
        gpu_pods=(lambda: dcgm.gpu_pods) if dcgm is not None else None,
        pod_resources=pod_resources,
        watch_timeout_s=d.watch_timeout_s,
        retry_s=d.retry_s,
        forget_after_s=d.forget_after_s,
    )


@dataclass(frozen=True)
class SourceEntry:
    name: str
    build: Callable[[SourcesConfig], list[Source]]
    lost_when_unsupported: str  # for the warning when it cannot run here


SOURCES: tuple[SourceEntry, ...] = (
    SourceEntry("recorder", _recorder, "per-step recording"),
    SourceEntry("vllm_metrics", _metrics, "metrics scraping"),
    SourceEntry("engine_log", _engine_logs, "engine-log capture"),
    SourceEntry("kmsg", _kmsg, "kernel-log Xid capture"),
    SourceEntry("nvml", _nvml, "GPU and Xid capture"),
    SourceEntry("dcgm", _dcgm, "GPU gauges from dcgm-exporter"),
)
BUILDERS = {entry.name: entry.build for entry in SOURCES}
LOST_WHEN_UNSUPPORTED = {
    **{entry.name: entry.lost_when_unsupported for entry in SOURCES},
    "discovery": "engine discovery",  # built by the recorder's entry, which shares its join
}
