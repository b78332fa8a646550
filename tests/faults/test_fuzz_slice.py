"""A bounded slice of scripts/fuzz.py: every parser and the codec, a few hundred mutated real
inputs each, nothing escaping but their own errors and no input over the per-byte CPU budget.
The full run (100,000 inputs a target) is a script; its figures are in RELIABILITY.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "scripts" / "fuzz.py"


def _load():
    spec = importlib.util.spec_from_file_location("flightrec_fuzz", FUZZ)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fuzz = _load()
TARGETS = fuzz.targets()


def test_every_parser_is_a_target() -> None:
    names = {t.name.split(".")[0] for t in TARGETS}
    assert {"crash_dump", "xid", "prom_text", "throughput_line", "vllm_log", "tracebacks", "codec", "ringfile", "naming", "redact"} <= names
    assert all(t.seeds for t in TARGETS), [t.name for t in TARGETS if not t.seeds]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_fuzz_slice(target, tmp_path: Path) -> None:
    result = fuzz.fuzz(target, 200, seed=1, budget=fuzz.DEFAULT_BUDGET, out=tmp_path)
    assert result.inputs == 200
    assert result.failures == [], sorted(set(result.failures))[:5]
