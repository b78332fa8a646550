"""The GPU run's JSON writer (scripts/gpu/gpu_run.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import gpu_run  # noqa: E402


def test_dumps_keeps_number_lists_on_one_line_and_round_trips() -> None:
    body = {"ttft_ms": [1.5, None, 3e-05, -2], "nested": {"rows": [[1, 2], [3]]}, "names": ["a", "b"], "empty": []}
    text = gpu_run.dumps(body)
    assert json.loads(text) == body
    assert '"ttft_ms": [1.5, null, 3e-05, -2]' in text
    assert '"a",' in text  # strings keep a line each
