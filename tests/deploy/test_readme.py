"""The README is a front door: short, its two commands as CI runs them, every link pointing at a
file that exists, and its Prometheus and Alertmanager snippets accepted by promtool and amtool
(the Alertmanager one with the shipped inhibitions, routing the flight recorder's alerts)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_is_short_and_runs_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/flightrec demo\n" in text
    assert "\nbash scripts/test.sh\n" in text
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "vLLM 0.26 to 0.34" in text


def test_every_relative_link_exists() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), target
    for path in re.findall(r"`((?:deploy|dashboards|rules|scripts|tests|docs)/[^`\s]+)`", README.read_text()):
        assert (ROOT / path.rstrip("/")).exists() or (ROOT / "deploy/kubernetes" / path).exists(), path


@pytest.mark.promtool
@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")
def test_the_prometheus_snippet_is_a_valid_config(tmp_path: Path) -> None:
    from collector.alerting.rules import render

    [snippet] = [b for b in blocks("yaml") if "scrape_configs" in b]
    cfg = yaml.safe_load(snippet)
    (tmp_path / "flightrec-alerts.yml").write_text(render((ROOT / "rules" / "flightrec-alerts.yml").read_text(), "https://wiki.example/flightrec"))
    (tmp_path / "token").write_text("t0ken\n")
    cfg["scrape_configs"][0]["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {j["job_name"] for j in cfg["scrape_configs"]} == {"flightrec", "vllm"}
    assert cfg["scrape_configs"][1]["static_configs"][0]["labels"].keys() == {"flightrec_engine", "Hostname"}


@pytest.mark.alertmanager
@pytest.mark.skipif(shutil.which("amtool") is None, reason="no amtool")
def test_the_alertmanager_snippet_with_the_shipped_inhibitions_routes_our_alerts(tmp_path: Path) -> None:
    [snippet] = [b for b in blocks("yaml") if "receivers:" in b]
    cfg = yaml.safe_load(snippet)
    cfg["inhibit_rules"] = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())["inhibit_rules"]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    for labels in (["alertname=VllmEngineCrashed", "Hostname=node-a", "engine=decode-0", "severity=critical"], ["alertname=GpuXidError", "gpu=1"]):
        r = subprocess.run(
            ["amtool", "config", "routes", "test", f"--config.file={path}", "--verify.receivers=inference-oncall", *labels],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        ["amtool", "config", "routes", "test", f"--config.file={path}", "alertname=SomethingElse"], capture_output=True, text=True, timeout=30
    )
    assert r.stdout.strip() == "default"
