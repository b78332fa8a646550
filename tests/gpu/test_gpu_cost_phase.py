"""The cost phase's per-level verdicts from its rounds (scripts/gpu/cost_phase.py): which figures
decide a level, and the ratios it reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import cost_phase  # noqa: E402


def _run(tok_s: float, ttft: float, itl: float, delivered: float) -> dict[str, float]:
    return {"tok_s": tok_s, "ttft_p99_ms": ttft, "itl_p99_ms": itl, "delivered_over_offered": delivered}


def _pairs() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for k, (ttft_r, ttft_n) in enumerate([(100, 140), (160, 100), (90, 130), (150, 95)]):
        # under capacity: tokens/s equal (what was offered), p99 TTFT all over the place
        out.append({"level": 0.5, "R": _run(1000 + k, ttft_r, 10.0, 1.0), "N": _run(1000 + k, ttft_n, 10.0, 1.0)})
        # above capacity: R 3% below N every round, latencies meaningless (the queue grows)
        out.append({"level": 1.2, "R": _run(970 + k, 9000.0 * (k + 1), 50.0, 0.81), "N": _run(1000 + k, 100.0, 20.0, 0.83)})
    return out


def test_above_capacity_only_throughput_decides() -> None:
    needs = cost_phase.needs(_pairs(), [0.5, 1.2], 0.015)
    assert needs["0.5"] > 1  # the TTFT ratios keep the level open
    assert needs["1.2"] < 1  # throughput is tight; its wild latencies do not count


def test_ratios_report_every_figure_with_the_regime() -> None:
    r = cost_phase.ratios(_pairs(), [0.5, 1.2])
    assert r["1.2"]["rounds"] == 4 and r["1.2"]["decides"] == ["tok_s"]
    assert r["1.2"]["tok_s"]["ratio"] == pytest.approx(0.97, abs=0.002)
    assert r["1.2"]["tok_s"]["verdict"] == "missed"  # the whole interval below 0.98
    assert r["0.5"]["tok_s"]["ratio"] == 1.0 and r["0.5"]["ttft_p99_ms"]["verdict"] == "undecided"
    assert r["1.2"]["delivered_over_offered_R"] == pytest.approx(0.81) and r["0.5"]["delivered_over_offered_N"] == 1.0
    assert r["0.5"]["cpu_us_per_token_api"]["rounds"] == 0  # not measured: no ratio, not 1
