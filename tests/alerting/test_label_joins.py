"""One fault, one alert: the sidecar's alert and the shipped rule's alert of the same fault carry
the same labels, so the shipped Alertmanager config (deploy/alertmanager/alertmanager.yml)
deduplicates them, groups them and lets the crash inhibit the engine's down alert.

The rule's side is pinned by promtool's unit tests (rules/tests/*.yml: the exp_labels each rule
produces); this file checks that the sidecar builds the very same label sets, that amtool
accepts and routes them, and that a real Alertmanager running the shipped config merges and
inhibits them."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from collector.alerting.alerts import alert_for_event, alert_for_state, rfc3339
from collector.detectors.base import DetectorState
from collector.model import Event, EventKind, GpuSample, Severity
from tests.support.alertmanager import LocalAlertmanager, WebhookReceiver, find_binary, with_webhook

ROOT = Path(__file__).resolve().parents[2]
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RULE_TESTS = sorted((ROOT / "rules" / "tests").glob("*.yml"))
AMTOOL = shutil.which("amtool")

HOST = "node-1"
H200_1 = GpuSample(gpu="GPU-abc", index=1, ts=0.0, bus_id="0000:00:06.0", name="NVIDIA H200")
CUDA = "torch.AcceleratorError: CUDA error: unspecified launch failure"
XID = "NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3, channel 0x0000000a"


def rule_labels(alertname: str) -> list[dict[str, str]]:
    """Every label set promtool's unit tests expect the rule ``alertname`` to produce."""
    out = []
    for path in RULE_TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                if case["alertname"] == alertname:
                    out += [{**{k: str(v) for k, v in a["exp_labels"].items()}, "alertname": alertname} for a in case.get("exp_alerts", [])]
    return out


def sidecar_crash() -> dict[str, str]:
    ev = Event(kind=EventKind.CUDA_ERROR, ts=time.time(), source="log", message=CUDA, engine="decode-0")
    alert = alert_for_event(ev, host=HOST, public_url="http://flightrec.local", snapshot_id=7)
    assert alert is not None
    return alert.label_set()


def sidecar_xid() -> dict[str, str]:
    ev = Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message=XID, xid=43, gpu="0000:00:06.0", severity=Severity.WARNING)
    alert = alert_for_event(ev, host=HOST, public_url="", gpus=[H200_1])
    assert alert is not None
    return alert.label_set()


def test_the_sidecar_and_the_rules_send_one_label_set_per_fault() -> None:
    assert sidecar_crash() in rule_labels("VllmEngineCrashed")
    xid = sidecar_xid()
    assert {**xid, "UUID": "GPU-abc"} in rule_labels("GpuXidError")
    stalled = alert_for_state(
        DetectorState("engine_stall", Severity.CRITICAL, "no tokens", labels={"engine": "decode-0"}, ts=1.0), host=HOST, public_url=""
    ).label_set()
    assert stalled in rule_labels("VllmEngineStalled")
    gone = alert_for_state(
        DetectorState("scrape_target_gone", Severity.CRITICAL, "gone", labels={"engine": "a"}, ts=1.0), host=HOST, public_url=""
    ).label_set()
    assert gone in rule_labels("VllmScrapeTargetGone")


def test_every_sidecar_alertname_is_one_the_rules_or_the_docs_know() -> None:
    from collector.alerting.alerts import DETECTOR_ALERTS

    rules = {r["alert"] for g in yaml.safe_load((ROOT / "rules" / "flightrec-alerts.yml").read_text())["groups"] for r in g["rules"] if "alert" in r}
    docs = (ROOT / "docs" / "alerting.md").read_text()
    for name in set(DETECTOR_ALERTS.values()) | {"VllmEngineCrashed", "GpuXidError", "GpuLost", "VllmEngineDown"}:
        assert name in rules or f"### {name}" in docs, name
    assert "FlightrecScrapeTargetGone" not in rules | set(DETECTOR_ALERTS.values())


# -- amtool ---------------------------------------------------------------------------------

needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="no amtool (Debian prometheus-alertmanager)")


@needs_amtool
def test_amtool_accepts_the_shipped_config() -> None:
    r = subprocess.run([str(AMTOOL), "check-config", str(AM_CONFIG)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@needs_amtool
@pytest.mark.parametrize("labels", [sidecar_crash(), *rule_labels("VllmEngineCrashed")[:1], sidecar_xid()])
def test_amtool_routes_both_senders_alike(labels: dict[str, str]) -> None:
    args = [f"{k}={v}" for k, v in sorted(labels.items())]
    r = subprocess.run(
        [str(AMTOOL), "config", "routes", "test", f"--config.file={AM_CONFIG}", "--verify.receivers=default", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stdout + r.stderr


# -- a real Alertmanager running the shipped config -----------------------------------------


def post(am: LocalAlertmanager, labels: dict[str, str], **annotations: str) -> None:
    now = time.time()
    body = [{"labels": labels, "annotations": annotations, "startsAt": rfc3339(now - 1), "endsAt": rfc3339(now + 600)}]
    httpx.post(am.url + "/api/v2/alerts", json=body, timeout=5).raise_for_status()


def wait_for(fn: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    return fn()


@pytest.mark.alertmanager
@pytest.mark.skipif(find_binary() is None, reason="no alertmanager binary")
def test_shipped_config_merges_the_two_senders_and_inhibits_down() -> None:
    hook = WebhookReceiver().start()
    am = LocalAlertmanager(hook.url, config_text=with_webhook(AM_CONFIG.read_text(), hook.url))
    try:
        am.start()
        crash = sidecar_crash()
        rule_crash = next(ls for ls in rule_labels("VllmEngineCrashed") if ls["engine"] == "decode-0")
        post(am, crash, summary="from the sidecar", snapshot_url="http://flightrec.local/snapshots/7")
        post(am, rule_crash, summary="from the rule")
        # the same engine, down, as the rule sees it (instance/job summed away)
        post(am, {"alertname": "VllmEngineDown", "severity": "critical", "Hostname": HOST, "engine": "decode-0"})
        # another host's down engine: not inhibited by this crash
        post(am, {"alertname": "VllmEngineDown", "severity": "critical", "Hostname": "node-2", "engine": "decode-0"})

        crashes = wait_for(lambda: am.alerts("VllmEngineCrashed"))
        assert len(crashes) == 1  # one alert: both senders' label sets are the same
        downs = wait_for(lambda: [a for a in am.alerts("VllmEngineDown") if a["status"]["state"] == "suppressed"])
        assert [a["labels"]["Hostname"] for a in downs] == [HOST]
        assert downs[0]["status"]["inhibitedBy"]
        notified = wait_for(lambda: [a for a in hook.alerts("firing") if a["labels"]["alertname"] == "VllmEngineCrashed"])
        assert {a["labels"]["Hostname"] for a in notified} == {HOST}
        assert not [a for a in hook.alerts("firing") if a["labels"]["alertname"] == "VllmEngineDown" and a["labels"]["Hostname"] == HOST]
    finally:
        am.close()
        hook.stop()


# Each fault as its alerts reach Alertmanager from both senders, and the one alert that must
# page for it (the shipped inhibitions quiet the rest). Hostnames keep the faults apart.
FAULTS: dict[str, tuple[list[dict[str, str]], set[str]]] = {
    # the incident: the decode engine dies (its crash, then down, gone, its scrape source down)
    "engine-death": (
        [
            {"alertname": "VllmEngineCrashed", "severity": "critical", "engine": "decode-0"},
            {"alertname": "VllmEngineDown", "severity": "critical", "engine": "decode-0"},
            {"alertname": "VllmScrapeTargetGone", "severity": "critical", "engine": "decode-0"},
            {"alertname": "VllmEngineStalled", "severity": "critical", "engine": "decode-0"},
            {"alertname": "FlightrecSourceDown", "severity": "warning", "source": "vllm_metrics:decode-0", "engine": "decode-0"},
            {"alertname": "VllmEngineWedged", "severity": "critical", "engine": "decode-0"},
        ],
        {"VllmEngineCrashed"},
    ),
    # a wedge (hang): requests held, no step, /health still 200
    "wedge": (
        [
            {"alertname": "VllmEngineWedged", "severity": "critical", "engine": "decode-0"},
            {"alertname": "VllmEngineStalled", "severity": "critical", "engine": "decode-0"},
            {"alertname": "VllmEngineStalled", "severity": "warning", "engine": "decode-0"},
            {"alertname": "VllmThroughputCollapse", "severity": "warning", "engine": "decode-0"},
            {"alertname": "VllmKvFetchStuck", "severity": "warning", "engine": "decode-0"},
        ],
        {"VllmEngineWedged"},
    ),
    # an engine that stopped answering with no crash seen
    "engine-down": (
        [
            {"alertname": "VllmEngineDown", "severity": "critical", "engine": "prefill-0"},
            {"alertname": "VllmScrapeTargetGone", "severity": "critical", "engine": "prefill-0"},
            {"alertname": "FlightrecSourceDown", "severity": "warning", "source": "vllm_metrics:prefill-0", "engine": "prefill-0"},
        ],
        {"VllmEngineDown"},
    ),
    # one GPU's fault: a critical Xid with the warning and info Xids and ECC counters it brings
    "gpu-fault": (
        [
            {"alertname": "GpuXidError", "severity": "critical", "gpu": "1", "UUID": "GPU-abc", "pci_bus_id": "00000000:00:06.0", "xid": "48"},
            {"alertname": "GpuXidError", "severity": "warning", "gpu": "1", "UUID": "GPU-abc", "pci_bus_id": "00000000:00:06.0", "xid": "43"},
            {"alertname": "GpuXidError", "severity": "info", "gpu": "1", "UUID": "GPU-abc", "pci_bus_id": "00000000:00:06.0", "xid": "45"},
            {"alertname": "GpuMemoryErrors", "severity": "critical", "gpu": "1", "UUID": "GPU-abc", "pci_bus_id": "00000000:00:06.0"},
        ],
        {"GpuXidError"},
    ),
    # a GPU off the bus
    "gpu-lost": (
        [
            {"alertname": "GpuLost", "severity": "critical", "gpu": "2", "UUID": "GPU-def", "pci_bus_id": "00000000:00:07.0"},
            {"alertname": "GpuXidError", "severity": "critical", "gpu": "2", "UUID": "GPU-def", "pci_bus_id": "00000000:00:07.0", "xid": "79"},
            {"alertname": "GpuThrottling", "severity": "critical", "gpu": "2", "UUID": "GPU-def", "pci_bus_id": "00000000:00:07.0"},
        ],
        {"GpuLost"},
    ),
}


@pytest.mark.alertmanager
@pytest.mark.skipif(find_binary() is None, reason="no alertmanager binary")
def test_the_shipped_inhibitions_leave_one_notification_per_fault() -> None:
    """Every fault's alerts, posted together to a real Alertmanager running the shipped config:
    each fault notifies once, with its one alert (``VllmEngineWedged`` is sent by the sidecar and
    by the rule over ``flightrec_engine_stuck_seconds``; it is pushed here by name)."""
    hook = WebhookReceiver().start()
    am = LocalAlertmanager(hook.url, config_text=with_webhook(AM_CONFIG.read_text(), hook.url, group_wait="2s", group_interval="1h"))
    try:
        am.start()
        for host, (alerts, _) in FAULTS.items():
            for labels in alerts:
                post(am, {**labels, "Hostname": host})
        wait_for(lambda: len({a["labels"]["Hostname"] for a in hook.alerts("firing")}) == len(FAULTS), timeout=20)
        time.sleep(3)  # any second notification a fault would wrongly send has had its group_wait
        for host, (_, pages) in FAULTS.items():
            notes = [n for n in hook.notifications if n["commonLabels"].get("Hostname") == host]
            assert len(notes) == 1, (host, [n["groupKey"] for n in notes])
            assert {a["labels"]["alertname"] for a in notes[0]["alerts"]} == pages, host
        # and a crash that comes after a wedge quiets the wedge's page
        suppressed = {(a["labels"]["Hostname"], a["labels"]["alertname"]) for a in am.alerts() if a["status"]["state"] == "suppressed"}
        assert ("engine-death", "VllmEngineWedged") in suppressed and ("wedge", "VllmEngineWedged") not in suppressed
    finally:
        am.close()
        hook.stop()
