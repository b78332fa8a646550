"""The version gate: under a vLLM outside the supported versions the recorder stays off and says
so in one log line, and vLLM starts and schedules as if it were not installed. The rule alone
without vLLM; then inside vLLM's real classes (inside_version_gate.py, vLLM's python)."""

from __future__ import annotations

import logging
import os
import subprocess
from typing import Any

import pytest
from vllm_env import HERE, MARKER, ROOT, vllm_python  # tests/vllm is on sys.path (pytest prepend import mode)

from collector.vllm import _version
from collector.vllm._version import SUPPORTED, gate, supported_range, unsupported_reason


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.26.0", True),
        ("0.32.0+cpu", True),
        ("0.34.0", True),
        ("0.34.2rc1", True),
        ("0.25.9", False),
        ("0.35.0", False),
        ("0.35.0.dev12+g1234abc", False),
        ("1.0.0", False),
        ("unknown", False),
        ("", False),
    ],
)
def test_supported_versions(version: str, ok: bool) -> None:
    assert (unsupported_reason(version, {}) is None) is ok


def test_the_range_is_what_the_readme_states() -> None:
    assert SUPPORTED == ((0, 26), (0, 34)) and supported_range() == "0.26 to 0.34"
    readme = (ROOT / "README.md").read_text()
    assert "vLLM 0.26 to 0.34" in readme


def test_any_vllm_records_under_any_version() -> None:
    assert unsupported_reason("0.99.0", {"FLIGHTREC_RECORDER_ANY_VLLM": "1"}) is None
    assert unsupported_reason("0.99.0", {"FLIGHTREC_RECORDER_ANY_VLLM": "0"}) is not None


def test_gate_logs_one_line_per_process(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_version, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="collector.recorder"):
        assert gate("0.35.1", {}) is False
        assert gate("0.35.1", {}) is False
        assert gate("0.32.0", {}) is True
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "vLLM 0.35.1 is outside the versions it supports (0.26 to 0.34)" in lines[0]
    assert "FLIGHTREC_RECORDER_ANY_VLLM=1" in lines[0]


def _inside(version: str, **env_extra: str) -> dict[str, Any]:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(env_extra)
    proc = subprocess.run(
        [vllm_python(), str(HERE / "inside_version_gate.py"), version], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len(MARKER) :])  # type: ignore[no-any-return]


@pytest.mark.vllm
def test_an_unsupported_vllm_starts_without_the_recorder() -> None:
    run = _inside("0.35.0")
    assert run["plugin_class"] == "collector.vllm.plugin.FlightRecorderStatLogger"  # loaded by vLLM
    assert run["plugin_records"] is False and run["scheduler_records"] is False
    assert run["scheduler_mro"][:2] == ["RecordingScheduler", "Scheduler"]
    assert run["scheduled"] == {"cmpl-gate-0-abcdef12": 32}  # vLLM schedules as without us
    assert run["files"] == []  # no ring written
    disabled = [m for m in run["messages"] if "disabled" in m]
    assert len(disabled) == 1 and "vLLM 0.35.0 is outside the versions it supports (0.26 to 0.34)" in disabled[0]


@pytest.mark.vllm
def test_any_vllm_overrides_the_gate_inside_vllm() -> None:
    run = _inside("0.35.0", FLIGHTREC_RECORDER_ANY_VLLM="1")
    assert run["plugin_records"] is True and run["scheduler_records"] is True
    assert any(".stats." in f for f in run["files"]) and any(".sched." in f for f in run["files"])
    assert run["messages"] == []


@pytest.mark.vllm
def test_the_cpu_builds_own_version_records() -> None:
    run = _inside("")  # an empty __version__: the version comes from the installed metadata
    assert run["plugin_records"] is True and run["scheduler_records"] is True and run["messages"] == []
