"""Alerts as data, and the builders that turn events and detector states into them.

Labels follow collector/alerting/labels.py, the scheme the shipped Prometheus rules use too:
CamelCase ``alertname``, ``severity`` (critical pages, warning, info), ``Hostname`` on every
alert, ``engine`` (the sidecar's engine name) on engine alerts, and dcgm-exporter's ``gpu``
(index), ``UUID`` and ``pci_bus_id`` on GPU alerts. Two alerts with the same label set are the
same alert to Alertmanager, so the label set is the key: a CUDA error line and the
EngineDeadError that follows it page once, as ``VllmEngineCrashed`` for that engine, and the
rule that sees the same crash in ``flightrec_snapshots_total`` sends that very label set.

An Xid alert's severity, meaning and action are the Xid catalog's (collector/xid/catalog.json),
the same catalog that labels ``flightrec_xid_events_total`` with the severity the rule pages with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from collector.alerting.labels import ALERT_GPU_LABELS, ENGINE, GPU_BUS, GPU_INDEX, GPU_MODEL, HOSTNAME, gpu_labels
from collector.detectors.base import DetectorState, Transition
from collector.model import ENGINE_ERROR_KINDS, Event, EventKind, GpuSample, Severity
from collector.redact import redact_text
from collector.xid.catalog import lookup as xid_lookup

AlertKey = frozenset[tuple[str, str]]

# alertname per detector name
DETECTOR_ALERTS: dict[str, str] = {
    "engine_stall": "VllmEngineStalled",
    "kv_cache_jump": "VllmKvCacheUsageJump",
    "preemption_storm": "VllmPreemptionStorm",
    "host_backlog": "VllmHiSparseHostBacklog",
    "throughput_collapse": "VllmThroughputCollapse",
    "itl_regression": "VllmInterTokenLatencyRegression",
    "gpu_throttling": "GpuThrottling",
    "gpu_memory_errors": "GpuMemoryErrors",
    "scrape_target_gone": "VllmScrapeTargetGone",
}


@dataclass(slots=True)
class Alert:
    name: str  # alertname, CamelCase
    severity: Severity
    labels: dict[str, str] = field(default_factory=dict)  # beyond alertname and severity
    annotations: dict[str, str] = field(default_factory=dict)
    starts_at: float = 0.0  # unix seconds
    ends_at: float | None = None  # set when resolved
    generator_url: str | None = None
    # One-off events (a crash, an Xid) resolve on their own after this time; None: until resolve().
    expires_at: float | None = None

    def label_set(self) -> dict[str, str]:
        out = {k: v for k, v in self.labels.items() if v}
        out["alertname"] = self.name
        out["severity"] = self.severity.value
        return out

    @property
    def key(self) -> AlertKey:
        return frozenset(self.label_set().items())

    def payload(self, ends_at: float) -> dict[str, Any]:
        """One element of the JSON array POSTed to /api/v2/alerts. Annotations carry the
        engine's own words (a log line, a manual reason): they leave redacted, like every copy
        the sidecar keeps or serves."""
        body: dict[str, Any] = {
            "labels": self.label_set(),
            "annotations": {k: redact_text(v) for k, v in self.annotations.items() if v},
            "startsAt": rfc3339(self.starts_at),
            "endsAt": rfc3339(ends_at),
        }
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body


def rfc3339(ts: float) -> str:
    stamp = datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def is_uri(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.scheme) and bool(parts.netloc)


def _link(public_url: str, path: str) -> str | None:
    if not public_url:
        return None
    url = public_url.rstrip("/") + path
    return url if is_uri(url) else None


def _runbook(runbook_base: str, alertname: str) -> str:
    return f"{runbook_base}#{alertname.lower()}" if runbook_base else ""


def _annotations(summary: str, description: str, runbook_base: str, alertname: str, **extra: str) -> dict[str, str]:
    out = {"summary": summary, "description": description, "runbook_url": _runbook(runbook_base, alertname)}
    out.update(extra)
    return out


def alert_for_event(
    event: Event,
    *,
    host: str,
    public_url: str,
    snapshot_id: str | int | None = None,
    runbook_base: str = "",
    hold: float = 3600.0,
    gpus: Iterable[GpuSample] = (),
) -> Alert | None:
    """The alert an event pages with, or None for events that do not page on their own.
    ``gpus`` (the hub's last samples) turn the event's GPU key into dcgm-exporter's labels."""
    gpus = list(gpus) or _gpu_of_event(event)
    snapshot_path = f"/snapshots/{quote(str(snapshot_id))}" if snapshot_id is not None else "/"
    generator = _link(public_url, snapshot_path)
    snapshot_note = {"snapshot_url": generator} if (generator and snapshot_id is not None) else {}
    engine = event.engine or ""
    base_labels = {HOSTNAME: host, ENGINE: engine}
    gpu_ids = gpu_labels(event.gpu, gpus, names=ALERT_GPU_LABELS)
    gpu_name = _gpu_name(event.gpu, gpus)
    first_line = event.message.strip().splitlines()[0][:300] if event.message.strip() else event.kind.value
    where = f"engine {engine}" if engine else f"host {host}"

    if event.kind in ENGINE_ERROR_KINDS:
        return crash_alert(event, engine=engine, host=host, public_url=public_url, snapshot_id=snapshot_id, runbook_base=runbook_base, hold=hold)
    if event.kind is EventKind.XID:
        name = "GpuXidError"
        xid = "" if event.xid is None else str(event.xid)
        info = xid_lookup(event.xid) if event.xid is not None else None
        catalog = {"meaning": f"{info.name}: {info.meaning}", "action": info.action} if info else {}
        return Alert(
            name=name,
            severity=event.severity,
            # no engine label: the rule that counts Xids sends this same set, so the two are one alert
            labels={HOSTNAME: host, **gpu_ids, "xid": xid},
            annotations=_annotations(
                f"GPU {gpu_name} on {host} raised Xid {xid or '?'}" + (f" ({info.name})" if info else ""),
                event.message[:2000] + (f"\nAction: {info.action}" if info else ""),
                runbook_base,
                name,
                **catalog,
                **snapshot_note,
            ),
            starts_at=event.ts,
            generator_url=generator,
            expires_at=event.ts + hold,
        )
    if event.kind is EventKind.GPU_LOST:
        name = "GpuLost"
        return Alert(
            name=name,
            severity=Severity.CRITICAL,
            labels={HOSTNAME: host, **gpu_ids},
            annotations=_annotations(
                f"GPU {gpu_name} on {host} fell off the bus",
                event.message[:2000],
                runbook_base,
                name,
                **snapshot_note,
            ),
            starts_at=event.ts,
            generator_url=generator,
            expires_at=event.ts + hold,
        )
    if event.kind is EventKind.ENGINE_DOWN:
        # Resolved by the caller when the engine answers again, not by a hold.
        name = "VllmEngineDown"
        return Alert(
            name=name,
            severity=Severity.CRITICAL,
            labels=base_labels,
            annotations=_annotations(
                f"vLLM {where} is down: /health or /metrics not answering",
                event.message[:2000],
                runbook_base,
                name,
                **snapshot_note,
            ),
            starts_at=event.ts,
            generator_url=generator,
        )
    if event.kind is EventKind.ENGINE_WEDGED:
        # Resolved by the caller when the engine steps again (engine_resumed) or goes down, not by a hold.
        name = "VllmEngineWedged"
        return Alert(
            name=name,
            severity=Severity.CRITICAL,
            labels=base_labels,
            annotations=_annotations(
                f"vLLM {where} is wedged: requests held, no step (its /health may still answer 200)",
                event.message[:2000] + (f"\nAction: {event.data['suggested_action']}" if event.data.get("suggested_action") else ""),
                runbook_base,
                name,
                **snapshot_note,
            ),
            starts_at=event.ts,
            generator_url=generator,
        )
    if event.kind is EventKind.NCCL_ERROR:
        name = "VllmNcclError"
        return Alert(
            name=name,
            severity=Severity.WARNING if event.severity is not Severity.CRITICAL else Severity.CRITICAL,
            labels=base_labels,
            annotations=_annotations(f"NCCL error on {where}: {first_line}", event.message[:2000], runbook_base, name, **snapshot_note),
            starts_at=event.ts,
            generator_url=generator,
            expires_at=event.ts + hold,
        )
    if event.kind is EventKind.ANOMALY and "detector" in event.data:
        level = Severity(event.data.get("state", event.severity.value))
        if level is Severity.OK:
            return None
        state = DetectorState(
            name=str(event.data["detector"]),
            state=level,
            reason=event.message,
            suggested_action=str(event.data.get("suggested_action", "")),
            labels={k: str(v) for k, v in dict(event.data.get("labels", {})).items()},
            ts=event.ts,
        )
        return alert_for_state(state, host=host, public_url=public_url, runbook_base=runbook_base, snapshot_id=snapshot_id, gpus=gpus)
    return None


def crash_alert(
    event: Event,
    *,
    engine: str,
    host: str,
    public_url: str,
    snapshot_id: str | int | None = None,
    runbook_base: str = "",
    hold: float = 3600.0,
) -> Alert:
    """``VllmEngineCrashed`` of ``engine``: from the engine's own error (a CUDA error, a fatal
    EngineCore error, EngineDeadError), or from any crash snapshot of it, whatever fault opened
    it (an Xid, a lost GPU, a silent recorder: ``CRASH_KINDS``). One label set per engine, the
    one the rule over ``flightrec_snapshots_total`` sends, so the engine's death is one page."""
    name = "VllmEngineCrashed"
    generator = _link(public_url, f"/snapshots/{quote(str(snapshot_id))}" if snapshot_id is not None else "/")
    snapshot_note = {"snapshot_url": generator} if (generator and snapshot_id is not None) else {}
    first_line = event.message.strip().splitlines()[0][:300] if event.message.strip() else event.kind.value
    where = f"engine {engine}" if engine else f"host {host}"
    process = f" ({event.process})" if event.process else ""
    return Alert(
        name=name,
        severity=Severity.CRITICAL,
        labels={HOSTNAME: host, ENGINE: engine},
        annotations=_annotations(
            f"vLLM {where} crashed: {first_line}",
            f"{event.kind.value} from {event.source}{process}: {event.message[:2000]}",
            runbook_base,
            name,
            **snapshot_note,
        ),
        starts_at=event.ts,
        generator_url=generator,
        expires_at=event.ts + hold,
    )


def _gpu_of_event(event: Event) -> list[GpuSample]:
    """What the event itself knows of its GPU (NVML's witness names index and UUID), for when
    the hub's samples are not at hand."""
    index, uuid = event.data.get("index"), event.data.get("uuid")
    if not event.gpu or not isinstance(index, int) or isinstance(index, bool):
        return []
    key = uuid if isinstance(uuid, str) and uuid.startswith("GPU-") else f"gpu{index}"
    return [GpuSample(gpu=key, index=index, ts=event.ts, bus_id=event.gpu if ":" in event.gpu else None)]


def _gpu_name(key: str | None, gpus: list[GpuSample]) -> str:
    """How a GPU is named in a summary: "1 (NVIDIA H200, 00000000:00:06.0)"."""
    labels = gpu_labels(key, gpus)
    head = labels[GPU_INDEX] or key or "?"
    detail = ", ".join(v for v in (labels[GPU_MODEL], labels[GPU_BUS]) if v and v != head)
    return f"{head} ({detail})" if detail else head


def _state_labels(host: str, labels: dict[str, str], gpus: list[GpuSample]) -> dict[str, str]:
    out = {HOSTNAME: host, **labels}
    if GPU_INDEX in labels:  # a detector names the GPU by our key: say it as dcgm-exporter does
        out.update(gpu_labels(labels[GPU_INDEX], gpus, names=ALERT_GPU_LABELS))
    return out


def alert_for_state(
    state: DetectorState,
    *,
    host: str,
    public_url: str,
    runbook_base: str = "",
    snapshot_id: str | int | None = None,
    gpus: Iterable[GpuSample] = (),
) -> Alert:
    """The alert of a detector state that is not OK (its severity is the state's level)."""
    gpus = list(gpus)
    if state.state is Severity.OK:
        raise ValueError("an OK detector state has no alert")
    name = DETECTOR_ALERTS.get(state.name) or "".join(p.capitalize() for p in state.name.split("_"))
    path = f"/snapshots/{quote(str(snapshot_id))}" if snapshot_id is not None else "/"
    subject = ", ".join(f"{k}={v}" for k, v in sorted(state.labels.items())) or host
    extra = {"value": f"{state.value:g}"} if state.value is not None else {}
    return Alert(
        name=name,
        severity=Severity(state.state.value),
        labels=_state_labels(host, state.labels, gpus),
        annotations=_annotations(
            f"{name} on {subject}: {state.reason}"[:300],
            f"{state.reason}. Suggested action: {state.suggested_action}" if state.suggested_action else state.reason,
            runbook_base,
            name,
            **extra,
        ),
        starts_at=state.ts,
        generator_url=_link(public_url, path),
    )


def alerts_for_transition(
    transition: Transition, *, host: str, public_url: str, runbook_base: str = "", gpus: Iterable[GpuSample] = ()
) -> tuple[Alert | None, AlertKey | None]:
    """(alert to fire, key to resolve) for one detector transition.

    warning -> critical resolves the warning alert and fires the critical one, as two
    Prometheus rules with different severities would.
    """
    fire = None
    resolve = None
    if transition.current.state is not Severity.OK:
        fire = alert_for_state(transition.current, host=host, public_url=public_url, runbook_base=runbook_base, gpus=gpus)
    if transition.previous.state is not Severity.OK:
        resolve = alert_for_state(transition.previous, host=host, public_url=public_url, runbook_base=runbook_base, gpus=gpus).key
    return fire, resolve
