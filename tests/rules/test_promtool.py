"""The Prometheus rules file passes `promtool check rules` and its unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules" / "flightrec-alerts.yml"
TESTS = sorted((ROOT / "rules" / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool")

pytestmark = [pytest.mark.promtool, pytest.mark.skipif(PROMTOOL is None, reason="no promtool binary")]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_check_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_rule_unit_tests(test_file: Path) -> None:
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_in_the_rules_has_a_severity_and_a_runbook() -> None:
    import yaml

    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"] if "alert" in r]
    assert rules
    for rule in rules:
        if "labels" not in rule:  # severity from the series (the Xid catalog's, on flightrec_xid_events_total)
            assert "severity)" in rule["expr"] and rule["alert"] == "GpuXidError", rule["alert"]
        else:
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["alert"][0].isupper() and "_" not in rule["alert"]
        assert rule["annotations"]["runbook_url"].startswith("RUNBOOK_BASE#")  # flightrec rules makes it absolute


def test_rendered_rules_link_absolute_runbooks_and_pass_the_same_unit_tests(tmp_path: Path) -> None:
    """What Prometheus loads: `flightrec rules --runbook-base URL`'s output, promtool-checked and
    run through every unit test with the links it must then carry."""
    import yaml

    from collector.alerting.rules import render

    base = "https://runbooks.test/flightrec/alerting"
    rendered = tmp_path / "flightrec-alerts.yml"
    rendered.write_text(render(RULES.read_text(), base + "/"))
    result = promtool("check", "rules", str(rendered))
    assert result.returncode == 0, result.stdout + result.stderr
    groups = yaml.safe_load(rendered.read_text())["groups"]
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
    assert urls and all(u.startswith(base + "#") for u in urls)
    for test_file in TESTS:
        text = test_file.read_text().replace("../flightrec-alerts.yml", str(rendered)).replace("RUNBOOK_BASE#", base + "#")
        copy = tmp_path / test_file.name
        copy.write_text(text)
        result = promtool("test", "rules", str(copy))
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_unit_test_group_sets_its_interval() -> None:
    import yaml

    for test_file in TESTS:
        for group in yaml.safe_load(test_file.read_text())["tests"]:
            assert "interval" in group, test_file.name


def test_the_crash_rule_counts_every_kind_after_which_the_engine_is_dead() -> None:
    """VllmEngineCrashed pages every crash snapshot whatever opened it: its trigger regex is the
    project's CRASH_KINDS, in both clauses (a kind added there must be added here)."""
    import re

    import yaml

    from collector.model import CRASH_KINDS

    groups = yaml.safe_load(RULES.read_text())["groups"]
    [rule] = [r for g in groups for r in g["rules"] if r.get("alert") == "VllmEngineCrashed"]
    regexes = re.findall(r'trigger=~"([^"]+)"', rule["expr"])
    assert len(regexes) == 2
    for regex in regexes:
        assert set(regex.split("|")) == {k.value for k in CRASH_KINDS}
