from __future__ import annotations

import random

import pytest

from collector.detectors.config import ThroughputThresholds
from collector.detectors.throughput import detect_throughput_collapse
from collector.model import Severity

THR = ThroughputThresholds(window_s=10, baseline_s=120)
L = {"engine": "decode-0"}


def run(tokens_per_s, demand, seconds=200, now=None):
    tokens = [(float(t), float(tokens_per_s(t))) for t in range(seconds)]
    load = [(float(t), float(demand(t))) for t in range(seconds)]
    return detect_throughput_collapse(tokens, load, now=float(now or seconds - 1), labels=L, thr=THR)


@pytest.mark.parametrize(
    ("after", "expected"),
    [(900, Severity.OK), (250, Severity.WARNING), (50, Severity.CRITICAL)],
)
def test_collapse_against_baseline(after: int, expected: Severity) -> None:
    state = run(lambda t: 1000 if t < 185 else after, lambda t: 16)
    assert state.state is expected


def test_less_demand_explains_less_throughput() -> None:
    assert run(lambda t: 1000 if t < 185 else 100, lambda t: 16 if t < 185 else 2).state is Severity.OK


def test_without_history_there_is_no_verdict() -> None:
    assert run(lambda t: 1000 if t < 15 else 0, lambda t: 16, seconds=30).state is Severity.OK


def test_noisy_throughput_does_not_warn() -> None:
    rng = random.Random(3)
    noise = [rng.uniform(400, 1600) for _ in range(400)]
    states = [run(lambda t: noise[t], lambda t: 16, seconds=400, now=n).state for n in range(140, 400, 7)]
    assert set(states) == {Severity.OK}
