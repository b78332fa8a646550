#!/usr/bin/env bash
# Installs everything the tests need and runs them (SQLite and the real Postgres, the real
# Alertmanager and promtool, Chromium). Extra arguments go to pytest.
# The real-vLLM tier is separate (it builds a 2 GB environment): .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest -m "not vllm" "$@"
