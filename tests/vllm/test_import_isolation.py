"""The code that runs inside vLLM imports nothing of the sidecar: a fresh interpreter imports the
stat-logger plugin and the scheduler module, and no sidecar stage (settings, alerting, detectors,
sources, storage, ...) nor a library only the sidecar needs (httpx, pydantic-settings, YAML,
SQLAlchemy, FastAPI) has been loaded by them. Without vLLM, vLLM's three base classes are stood
in for by empty ones; with the vLLM virtualenv, on its real classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_env import vllm_python  # tests/vllm is on sys.path (pytest prepend import mode)

ROOT = Path(__file__).resolve().parents[2]
# What the recorder may import of this package: shared ground, the channel, itself.
OURS_ALLOWED = (
    "collector",
    "collector.errors",
    "collector.model",
    "collector.redact",
    "collector.cgroup",
    "collector.channel",
    "collector.recorder",
    "collector.vllm",
)
SIDECAR_LIBRARIES = ("httpx", "pydantic_settings", "yaml", "sqlalchemy", "fastapi", "alembic", "uvicorn", "prometheus_client", "pynvml")

STUBS = """
import sys, types
def stub(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
for pkg in ("vllm", "vllm.v1", "vllm.v1.metrics", "vllm.v1.core", "vllm.v1.core.sched"):
    stub(pkg, __path__=[])
class Scheduler: pass
class AsyncScheduler(Scheduler): pass
class StatLoggerBase: pass
stub("vllm.v1.metrics.loggers", StatLoggerBase=StatLoggerBase)
stub("vllm.v1.core.sched.scheduler", Scheduler=Scheduler)
stub("vllm.v1.core.sched.async_scheduler", AsyncScheduler=AsyncScheduler)
"""
REAL = "import vllm.v1.metrics.loggers, vllm.v1.core.sched.async_scheduler, vllm.v1.core.sched.scheduler\n"
PROBE = """
import json, sys
before = set(sys.modules)
import collector.vllm.plugin, collector.vllm.scheduler
print("ADDED " + json.dumps(sorted(set(sys.modules) - before)))
"""


def _added(python: str, prelude: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(ROOT)  # this tree's collector, whatever is installed there
    proc = subprocess.run([python, "-c", prelude + PROBE], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ADDED ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("ADDED ") :])  # type: ignore[no-any-return]


def _sidecar_modules(added: list[str]) -> list[str]:
    def ours_ok(name: str) -> bool:
        return any(name == a or (a != "collector" and name.startswith(a + ".")) for a in OURS_ALLOWED)

    bad = [m for m in added if m.startswith("collector") and not ours_ok(m)]
    bad += [m for m in added if m.split(".")[0] in SIDECAR_LIBRARIES]
    return bad


def test_the_check_names_what_the_sidecar_would_bring() -> None:
    # the check itself: it would have caught what the recorder imported before (collector.settings)
    assert _sidecar_modules(["collector.settings", "collector.alerting.alerts", "yaml", "pydantic_settings.main", "collector.recorder.env"]) == [
        "collector.settings",
        "collector.alerting.alerts",
        "yaml",
        "pydantic_settings.main",
    ]


def test_recorder_imports_nothing_of_the_sidecar() -> None:
    added = _added(sys.executable, STUBS)
    assert "collector.vllm.plugin" in added and "collector.vllm.scheduler" in added
    assert _sidecar_modules(added) == []


@pytest.mark.vllm
def test_recorder_imports_nothing_of_the_sidecar_in_vllm() -> None:
    added = _added(vllm_python(), REAL)
    assert "collector.vllm.plugin" in added and "collector.vllm.scheduler" in added
    assert _sidecar_modules(added) == []


def test_recorder_writes_the_format_without_loading_the_readers() -> None:
    # the decoders and the sidecar's domain model they build were half of the recorder's import
    # time (bench/bench_recorder_import.py); the writing side is collector.channel.wire
    added = _added(sys.executable, STUBS)
    assert "collector.channel.wire" in added
    assert not {"collector.model", "collector.channel.codec", "collector.channel.blocks"} & set(added)
