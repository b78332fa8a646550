"""The user's own tools see the fault: a real Prometheus (Debian's 2.42) scrapes a real
`flightrec demo` (the sidecar) and its simulated vLLM pair every second, evaluates the rules as
`flightrec rules` renders them, and sends to a real Alertmanager running the shipped config,
which the sidecar pages too. A webhook on loopback sees what a pager would.

The demo's incident is one GPU fault (Xid 43 on GPU 1) and one engine death (decode-0): it must
notify exactly twice, once each, after both senders have delivered everything they fire; and
every Prometheus query of the shipped dashboard runs against that Prometheus, the panels the
demo fills with data.

The rules' ``for:`` durations are capped at 10 s here so that the alerts they hold back (the
dead engine's VllmEngineDown, VllmScrapeTargetGone, FlightrecSourceDown) reach Alertmanager
within the test, where the inhibitions must quiet them; the shipped durations are pinned by
promtool's unit tests (rules/tests)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.alerting.rules import render
from tests.support.alertmanager import LocalAlertmanager, WebhookReceiver, with_webhook
from tests.support.alertmanager import find_binary as find_alertmanager
from tests.support.prometheus import LocalPrometheus, LocalPrometheusError
from tests.support.prometheus import find_binary as find_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules" / "flightrec-alerts.yml"
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
DASHBOARD = ROOT / "dashboards" / "flightrec.json"
HOST = "node-t"
FOR_CAP_S = 10

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.alertmanager,
    pytest.mark.slow,
    pytest.mark.skipif(find_prometheus() is None, reason="no prometheus binary (Debian: prometheus)"),
    pytest.mark.skipif(find_alertmanager() is None, reason="no alertmanager binary"),
]

# What the demo must fill: every other panel's queries must still run without an error.
FILLED_PANELS = {
    "Engines up",
    "Engines down",
    "Crash snapshots in range",
    "Xid events in range",
    "Failing sources",
    "Database",
    "Running / waiting requests",
    "KV-cache usage",
    "Preemptions / s",
    "Tokens / s",
    "Inter-token latency p95 / TTFT p95",
    "Steps recorded / s and host-mirror rows",
    "GPU temperature",
    "GPU power",
    "GPU utilisation",
    "GPU memory used",
    "Xid events",
    "Throttle reasons (clock-event mask)",
    "Snapshots taken",
    "Sources up",
    "Engines up / database / dropped rows",
}


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration))


def test_rules() -> str:
    """The rules as `flightrec rules` renders them, each ``for:`` capped at FOR_CAP_S."""
    doc = yaml.safe_load(render(RULES.read_text(), "https://runbooks.test/alerting"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule and _seconds(rule["for"]) > FOR_CAP_S:
                rule["for"] = f"{FOR_CAP_S}s"
    return str(yaml.safe_dump(doc, sort_keys=False))


test_rules.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


class Demo:
    """`flightrec demo` in a child process, its stdout read for the URLs it prints."""

    def __init__(self, workdir: Path, alertmanager: str) -> None:
        cfg = workdir / "flightrec.yaml"
        cfg.write_text(
            yaml.safe_dump({"alertmanager": [alertmanager], "host_name": HOST, "alerting": {"runbook_base": "https://runbooks.test/alerting"}})
        )
        self.lines: list[str] = []
        self.api = self.prefill = self.decode = ""
        self.crashed = threading.Event()
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "demo",
                "--port",
                "0",
                "--workdir",
                str(workdir / "demo"),
                "--db",
                f"sqlite:///{workdir / 'f.db'}",
            ]
            + ["--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=workdir,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if m := re.search(r"API (http://\S+)/api/v1", line):
                self.api = m.group(1)
            if m := re.search(r"prefill-0 on :(\d+), decode-0 on :(\d+)", line):
                self.prefill, self.decode = m.groups()
                self.ready.set()
            if "serving until" in line:
                self.crashed.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        return "".join(self.lines[-40:])


def wait_until(what: str, fn: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Stack:
    def __init__(self, prom: LocalPrometheus, am: LocalAlertmanager, hook: WebhookReceiver, demo: Demo, started: float) -> None:
        self.prom, self.am, self.hook, self.demo, self.started = prom, am, hook, demo, started
        self.crashed_at = 0.0
        self.settled_at = 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stack")
    hook = WebhookReceiver().start()
    # the shipped routes and inhibitions, their waits short: a group that changed after its first
    # notification (an alert of the other sender with other labels) would notify again in 3 s
    am = LocalAlertmanager(hook.url, config_text=with_webhook(AM_CONFIG.read_text(), hook.url, group_wait="2s", group_interval="3s"))
    prom = LocalPrometheus(rules=test_rules(), alertmanager=am.url, interval="1s")
    demo: Demo | None = None
    try:
        am.start()
        prom.start()
        started = time.time()
        demo = Demo(workdir, am.url)
        assert demo.ready.wait(90), demo.output()
        prom.set_targets(
            [
                {"targets": [demo.api.split("//", 1)[1]], "labels": {"job": "flightrec"}},
                # vLLM's own scrape, mapped onto the sidecar's engine names (deploy/prometheus)
                {"targets": [f"127.0.0.1:{demo.prefill}"], "labels": {"job": "vllm", "flightrec_engine": "prefill-0", "Hostname": HOST}},
                {"targets": [f"127.0.0.1:{demo.decode}"], "labels": {"job": "vllm", "flightrec_engine": "decode-0", "Hostname": HOST}},
            ]
        )
        st = Stack(prom, am, hook, demo, started)
        assert demo.crashed.wait(180), demo.output()
        st.crashed_at = time.time()
        # everything the dead engine's death raises, through Prometheus too: the held-back
        # alerts have reached Alertmanager (where they must be suppressed)
        wanted = {"VllmEngineCrashed", "GpuXidError", "VllmEngineDown", "VllmScrapeTargetGone", "FlightrecSourceDown"}
        wait_until(
            f"Prometheus firing {sorted(wanted)}",
            lambda: wanted <= {a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"},
            timeout=90,
        )
        wait_until("Alertmanager holding them", lambda: wanted <= {a["labels"]["alertname"] for a in am.alerts()}, timeout=30)
        time.sleep(7)  # past group_wait and group_interval: any notification the inhibitions failed to stop is sent
        st.settled_at = time.time()
        yield st
    finally:
        if demo is not None:
            demo.stop()
        prom.close()
        am.close()
        hook.stop()


def test_the_incident_notifies_once_per_fault(stack: Stack) -> None:
    notes = [n for n in stack.hook.notifications if n["status"] == "firing"]
    got = sorted((n["commonLabels"]["alertname"], n["commonLabels"].get("engine") or n["commonLabels"].get("gpu", "")) for n in notes)
    assert got == [("GpuXidError", "1"), ("VllmEngineCrashed", "decode-0")], json.dumps(notes, indent=1)[:4000]
    # the held-back alerts of the dead engine reached Alertmanager from Prometheus and are quiet
    states = {(a["labels"]["alertname"], a["labels"].get("engine", "")): a["status"]["state"] for a in stack.am.alerts()}
    for name in ("VllmEngineDown", "VllmScrapeTargetGone", "FlightrecSourceDown"):
        assert states[(name, "decode-0")] == "suppressed", states


def test_prometheus_fires_the_sidecars_own_label_sets(stack: Stack) -> None:
    """Each alert the demo's incident raises from both senders is one alert in Alertmanager:
    the rule's label set is the sidecar's."""
    firing = [a for a in stack.prom.alerts() if a["state"] == "firing"]
    for name, expected in (
        ("VllmEngineCrashed", {"Hostname": HOST, "engine": "decode-0", "severity": "critical"}),
        ("GpuXidError", {"Hostname": HOST, "gpu": "1", "xid": "43", "severity": "warning"}),
    ):
        [rule] = [a["labels"] for a in firing if a["labels"]["alertname"] == name]
        [held] = [a for a in stack.am.alerts(name)]
        assert rule == held["labels"], (rule, held["labels"])
        assert expected.items() <= rule.items()
    # the sidecar's copy links the snapshot (the merged alert keeps the newest sender's fields)
    [crash] = stack.am.alerts("VllmEngineCrashed")
    assert crash["status"]["state"] == "active"


def test_first_xid_and_first_snapshot_are_visible_to_prometheus(stack: Stack) -> None:
    """The series born with the event: a critical code was exported from 0 before the fault;
    43 (a warning) is born at 1 and still counted; the crash snapshot series was 0 before."""
    at = stack.settled_at
    xids = {r["metric"]["xid"]: float(r["value"][1]) for r in stack.prom.query('flightrec_xid_events_total{gpu="1"}', at)}
    assert xids["43"] == 1 and xids["79"] == 0
    before = stack.prom.query('flightrec_snapshots_total{engine="decode-0", trigger="xid"}', stack.crashed_at - 5)
    assert [float(r["value"][1]) for r in before] == [0.0]


def dashboard_queries() -> list[tuple[str, str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for t in p.get("targets", []):
                ds = t.get("datasource") or p.get("datasource") or {}
                if ds.get("type") == "prometheus":
                    out.append((p["title"], t["refId"], t["expr"]))
    return out


def grafana_expand(expr: str, range_s: float) -> str:
    """Grafana's variables as a user with everything selected sees them: `$__rate_interval`
    is max(4 x scrape interval, step + scrape interval) = 4 s at 1 s scrapes."""
    for var in ("$instance", "$engine", "$gpu"):
        expr = expr.replace(f'=~"{var}"', '=~".*"')
    return expr.replace("$__rate_interval", "4s").replace("$__range", f"{int(range_s)}s").replace("$__interval", "1s")


def test_every_dashboard_query_runs_and_the_demos_panels_have_data(stack: Stack) -> None:
    start, end = stack.started, stack.settled_at
    with_data: set[str] = set()
    for title, ref, expr in dashboard_queries():
        query = grafana_expand(expr, end - start)
        try:
            series = stack.prom.query_range(query, start, end, step=1.0)
        except LocalPrometheusError as exc:
            raise AssertionError(f"panel {title!r} {ref}: {exc}") from None
        if any(float(v) == float(v) for s in series for _, v in s["values"]):  # NaN is no data
            with_data.add(title)
    assert sorted(FILLED_PANELS - with_data) == []
    # the stats count the incident: one crash snapshot of decode-0, one Xid
    [crashes] = [e for t, _, e in dashboard_queries() if t == "Crash snapshots in range"]
    [xids] = [e for t, _, e in dashboard_queries() if t == "Xid events in range"]
    for expr in (crashes, xids):
        [result] = stack.prom.query(grafana_expand(expr, end - start), end)
        assert round(float(result["value"][1])) == 1, expr


def test_the_demos_crash_signature_holds_the_late_evidence(stack: Stack) -> None:
    """The Xid opened the decode engine's snapshot; the workers' CUDA errors and tracebacks came
    after it. The fleet view's signature of that crash holds them (it is amended as they come)."""
    import httpx

    groups = httpx.get(stack.demo.api + "/api/v1/fleet/crashes", timeout=10).json()
    [group] = [g for g in groups["items"] if "decode-0" in " ".join(g["engines"])]
    detail = group["detail"]
    assert detail["xid"] == [43] and detail["cuda_error"] == "unspecified launch failure"
    assert detail["exception"] == "torch.AcceleratorError" and len(detail["frames"]) == 2  # both TP workers
