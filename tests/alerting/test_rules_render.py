"""`flightrec rules`: the shipped rules with absolute runbook links from a setting, and the
setting refusing a link a pager cannot follow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from collector.alerting.rules import MARKER, RulesError, check_base, render, shipped_rules
from collector.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_render_keeps_the_text_and_replaces_each_marker() -> None:
    text = shipped_rules().read_text()
    out = render(text, "https://wiki.example/flightrec/alerting/")
    assert not [ln for ln in out.splitlines() if "runbook_url" in ln and MARKER in ln]
    assert 'runbook_url: "https://wiki.example/flightrec/alerting#flightrecsourcedown"' in out
    assert out.count("\n") == text.count("\n") and "# Runbooks:" in out  # comments and layout kept


@pytest.mark.parametrize("bad", ["", "docs/alerting.md", "/runbooks", "wiki.example/x", "ftp://x/y", "https://", "https://h/x#frag"])
def test_a_relative_or_odd_base_is_refused(bad: str) -> None:
    with pytest.raises(RulesError, match="absolute"):
        check_base(bad)


def test_the_setting_is_absolute_or_empty() -> None:
    assert load_settings(alerting={"runbook_base": "https://wiki.example/a/"}).alerting.runbook_base == "https://wiki.example/a"
    assert load_settings().alerting.runbook_base == ""
    with pytest.raises(SettingsError, match="alerting.runbook_base"):
        load_settings(alerting={"runbook_base": "docs/alerting.md"})


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "collector.cli", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_the_command(tmp_path: Path) -> None:
    r = cli("rules", "--runbook-base", "https://wiki.example/fr")
    assert r.returncode == 0, r.stderr
    assert "https://wiki.example/fr#vllmenginestalled" in r.stdout
    cfg = tmp_path / "flightrec.yaml"
    cfg.write_text("alerting:\n  runbook_base: https://runbooks.corp/flightrec\n")
    out = tmp_path / "rules.yml"
    r = cli("rules", "--config", str(cfg), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "https://runbooks.corp/flightrec#gpuxiderror" in out.read_text()
    r = cli("rules")
    assert r.returncode == 2 and "runbook base" in r.stderr
    r = cli("rules", "--runbook-base", "docs/alerting.md")
    assert r.returncode == 2 and "absolute" in r.stderr
