"""Alert builders: labels, severities, links, keys."""

from __future__ import annotations

import pytest

from collector.alerting.alerts import (
    alert_for_event,
    alert_for_state,
    alerts_for_transition,
    is_uri,
    rfc3339,
)
from collector.detectors.base import DetectorState, Transition
from collector.model import Event, EventKind, GpuSample, Severity
from collector.xid.catalog import lookup as xid_lookup

# A real kernel-log Xid line (fixtures/kmsg-h200-xid.txt) and a real vLLM worker error line.
XID_LINE = "NVRM: Xid (PCI:0000:00:06): 31, pid=444, name=python3, channel 0x0000000a, intr 00000000."
CUDA_LINE = "(Worker_TP0 pid=3107) ERROR 09-13 10:41:07 [multiproc_executor.py:1063] torch.AcceleratorError: CUDA error: unspecified launch failure"

KW = dict(host="node-1", public_url="http://flightrec.local:8080", runbook_base="https://docs.example/alerting")


@pytest.mark.parametrize(
    "kind",
    [EventKind.CUDA_ERROR, EventKind.ENGINE_FATAL, EventKind.ENGINE_DEAD],
)
def test_crash_kinds_page_as_one_critical_alert_per_engine(kind: EventKind) -> None:
    event = Event(kind=kind, ts=1757760067.5, source="log", message=CUDA_LINE, engine="decode-0", process="Worker_TP0")
    alert = alert_for_event(event, snapshot_id=42, **KW)
    assert alert is not None
    assert alert.label_set() == {"alertname": "VllmEngineCrashed", "severity": "critical", "engine": "decode-0", "Hostname": "node-1"}
    assert alert.generator_url == "http://flightrec.local:8080/snapshots/42"
    assert alert.annotations["runbook_url"] == "https://docs.example/alerting#vllmenginecrashed"
    assert "unspecified launch failure" in alert.annotations["summary"]
    assert "Worker_TP0" in alert.annotations["description"]
    assert alert.expires_at is not None and alert.expires_at > event.ts


def test_a_cuda_error_and_the_engine_death_after_it_are_the_same_alert() -> None:
    cuda = Event(kind=EventKind.CUDA_ERROR, ts=1.0, source="log", message=CUDA_LINE, engine="decode-0")
    dead = Event(kind=EventKind.ENGINE_DEAD, ts=2.0, source="log", message="EngineDeadError", engine="decode-0")
    other = Event(kind=EventKind.ENGINE_DEAD, ts=2.0, source="log", message="EngineDeadError", engine="prefill-0")
    a, b, c = (alert_for_event(e, **KW) for e in (cuda, dead, other))
    assert a is not None and b is not None and c is not None
    assert a.key == b.key != c.key


@pytest.mark.parametrize("severity", [Severity.CRITICAL, Severity.WARNING, Severity.INFO])
def test_xid_takes_the_catalog_severity_and_carries_gpu_and_xid(severity: Severity) -> None:
    event = Event(kind=EventKind.XID, ts=10.0, source="kmsg", message=XID_LINE, severity=severity, gpu="0000:00:06.0", xid=31, pid=444)
    alert = alert_for_event(event, **KW)
    assert alert is not None
    labels = alert.label_set()
    assert labels["alertname"] == "GpuXidError"
    assert labels["severity"] == severity.value
    # no NVML sample names this GPU: the bus id is all that is known, in dcgm-exporter's form
    assert labels["pci_bus_id"] == "00000000:00:06.0" and labels["xid"] == "31" and "gpu" not in labels
    assert "engine" not in labels  # unknown engine: no empty label
    assert alert.generator_url == "http://flightrec.local:8080/"


def test_engine_down_has_no_hold_and_gpu_lost_is_critical() -> None:
    down = alert_for_event(Event(kind=EventKind.ENGINE_DOWN, ts=1.0, source="scrape", message="refused", engine="decode-0"), **KW)
    lost = alert_for_event(Event(kind=EventKind.GPU_LOST, ts=1.0, source="nvml", message="GPU is lost", gpu="0000:00:06.0"), **KW)
    assert down is not None and down.name == "VllmEngineDown" and down.expires_at is None
    assert lost is not None and lost.name == "GpuLost" and lost.severity is Severity.CRITICAL


@pytest.mark.parametrize("kind", [EventKind.LOG, EventKind.MANUAL, EventKind.CRASH_DUMP, EventKind.RECORDER_SILENT])
def test_events_that_do_not_page(kind: EventKind) -> None:
    assert alert_for_event(Event(kind=kind, ts=1.0, source="log", message="x"), **KW) is None


@pytest.mark.parametrize("public_url", ["", "not a url", "flightrec.local:8080"])
def test_no_generator_url_unless_it_is_a_uri(public_url: str) -> None:
    event = Event(kind=EventKind.ENGINE_DEAD, ts=1.0, source="log", message="dead", engine="e")
    alert = alert_for_event(event, host="h", public_url=public_url, snapshot_id=1)
    assert alert is not None
    assert "generatorURL" not in alert.payload(2.0)


def test_payload_is_what_alertmanager_v2_takes() -> None:
    event = Event(kind=EventKind.ENGINE_DEAD, ts=1757760067.25, source="log", message="dead", engine="e")
    alert = alert_for_event(event, snapshot_id="a b", **KW)
    assert alert is not None
    body = alert.payload(1757760367.25)
    assert body["startsAt"] == "2025-09-13T10:41:07.250Z"
    assert body["endsAt"] == "2025-09-13T10:46:07.250Z"
    assert is_uri(body["generatorURL"]) and body["generatorURL"].endswith("/snapshots/a%20b")
    assert all(isinstance(v, str) and v for v in body["labels"].values())
    assert all(isinstance(v, str) and v for v in body["annotations"].values())


def test_anomaly_event_and_detector_state_build_the_same_alert() -> None:
    state = DetectorState(
        "engine_stall", Severity.CRITICAL, "3 requests waiting and no token computed for 31s", "py-spy dump", 31.0, {"engine": "decode-0"}, 100.0
    )
    event = Event(
        kind=EventKind.ANOMALY,
        ts=100.0,
        source="detector",
        message=state.reason,
        severity=Severity.CRITICAL,
        data={"detector": "engine_stall", "state": "critical", "labels": {"engine": "decode-0"}},
    )
    from_state = alert_for_state(state, **KW)
    from_event = alert_for_event(event, **KW)
    assert from_event is not None
    assert from_state.key == from_event.key
    assert from_state.label_set()["alertname"] == "VllmEngineStalled"
    assert "py-spy dump" in from_state.annotations["description"]


def test_transitions_fire_the_new_level_and_resolve_the_old_one() -> None:
    ok = DetectorState("preemption_storm", Severity.OK, labels={"engine": "d"})
    warn = DetectorState("preemption_storm", Severity.WARNING, "6 preemptions", labels={"engine": "d"}, ts=5.0)
    crit = DetectorState("preemption_storm", Severity.CRITICAL, "60 preemptions", labels={"engine": "d"}, ts=6.0)
    fire, resolve = alerts_for_transition(Transition(ok, warn), **KW)
    assert fire is not None and fire.severity is Severity.WARNING and resolve is None
    fire2, resolve2 = alerts_for_transition(Transition(warn, crit), **KW)
    assert fire2 is not None and fire2.severity is Severity.CRITICAL and resolve2 == fire.key
    fire3, resolve3 = alerts_for_transition(Transition(crit, ok), **KW)
    assert fire3 is None and resolve3 == fire2.key


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


H200 = GpuSample(gpu="GPU-5c1e0d2a-1111-2222-3333-444455556666", index=1, ts=0.0, bus_id="0000:00:06.0", name="NVIDIA H200")


def test_gpu_alerts_carry_dcgm_labels_and_the_catalog_meaning() -> None:
    event = Event(kind=EventKind.XID, ts=10.0, source="kmsg", message=XID_LINE, severity=Severity.WARNING, gpu="0000:00:06.0", xid=43, pid=444)
    alert = alert_for_event(event, gpus=[H200], **KW)
    assert alert is not None
    assert alert.label_set() == {
        "alertname": "GpuXidError",
        "severity": "warning",
        "Hostname": "node-1",
        "gpu": "1",
        "UUID": H200.gpu,
        "pci_bus_id": "00000000:00:06.0",
        "xid": "43",
    }
    info = xid_lookup(43)
    assert alert.annotations["action"] == info.action and info.meaning in alert.annotations["meaning"]
    assert "NVIDIA H200" in alert.annotations["summary"]


def test_a_gpu_detector_alert_names_the_gpu_as_the_xid_alert_does() -> None:
    state = DetectorState("gpu_throttling", Severity.CRITICAL, "HW slowdown", labels={"gpu": H200.gpu}, ts=1.0)
    alert = alert_for_state(state, gpus=[H200], **KW)
    labels = alert.label_set()
    assert {k: labels[k] for k in ("gpu", "UUID", "pci_bus_id", "Hostname")} == {
        "gpu": "1",
        "UUID": H200.gpu,
        "pci_bus_id": "00000000:00:06.0",
        "Hostname": "node-1",
    }


def test_one_name_for_a_gone_scrape_target() -> None:
    state = DetectorState("scrape_target_gone", Severity.CRITICAL, "no /metrics for 30 s", labels={"engine": "decode-0"}, ts=1.0)
    assert alert_for_state(state, **KW).name == "VllmScrapeTargetGone"


def test_the_runbook_lists_the_catalog_as_it_is() -> None:
    """docs/alerting.md's Xid table, which the rule's annotation points at, is the catalog's."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "alerting.md").read_text()
    catalog = json.loads((root / "collector" / "xid" / "catalog.json").read_text())
    for code, e in catalog["codes"].items():
        assert f"| {code} | {e['name']} | {e['severity']} | {e['category']} | {e['meaning']} | {e['action']} |" in docs, code


def test_alerts_leave_redacted() -> None:
    # the engine's own words reach Alertmanager (and its receivers) only redacted
    msg = CUDA_LINE + " while writing to postgresql://u:hunter2@db/x with --api-key sk-live-abcdef123"
    event = Event(kind=EventKind.CUDA_ERROR, ts=1757760067.5, source="log", message=msg, engine="decode-0", process="Worker_TP0")
    alert = alert_for_event(event, snapshot_id=42, **KW)
    assert alert is not None
    wire = repr(alert.payload(ends_at=1757760367.5))
    assert "hunter2" not in wire and "sk-live-abcdef123" not in wire
    assert "unspecified launch failure" in wire and "u:***@db" in wire
