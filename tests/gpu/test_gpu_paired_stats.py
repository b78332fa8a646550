"""The statistics of the GPU cost phase (scripts/gpu/paired_stats.py): Student's t quantiles,
the paired log-ratio interval, the bootstrap, the goals' verdicts and which level runs next."""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import paired_stats as ps  # noqa: E402

# Student's t 0.975 quantiles from an independent source (published tables, 4 decimals)
KNOWN_T = {1: 12.7062, 2: 4.3027, 3: 3.1824, 5: 2.5706, 9: 2.2622, 15: 2.1314, 30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799, 1000: 1.9623}


@pytest.mark.parametrize("df,want", sorted(KNOWN_T.items()))
def test_t975_matches_published_quantiles(df: int, want: float) -> None:
    assert ps.t975(df) == pytest.approx(want, abs=1.5e-3)


def test_t975_falls_toward_the_normal_quantile_and_refuses_zero_df() -> None:
    values = [ps.t975(df) for df in range(1, 200)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] > 1.96
    with pytest.raises(ValueError):
        ps.t975(0)


def test_log_ratios_skip_rounds_missing_a_side() -> None:
    d = ps.log_ratios([2.0, None, 3.0, 0.0, 4.0], [1.0, 1.0, None, 1.0, 4.0])
    assert d == pytest.approx([math.log(2.0), 0.0])


def test_t_interval_by_hand() -> None:
    # ratios 1.02, 0.98, 1.01, 0.99: mean log ~0, sd of logs s, half-width t(3) * s / 2
    r = [102.0, 98.0, 101.0, 99.0]
    n = [100.0] * 4
    d = [math.log(x / 100) for x in r]
    s = statistics.stdev(d)
    h = 3.182 * s / 2
    est = ps.t_interval(d)
    assert est["n"] == 4
    assert est["ratio"] == pytest.approx(math.exp(statistics.fmean(d)))
    assert est["lo"] == pytest.approx(math.exp(statistics.fmean(d) - h))
    assert est["hi"] == pytest.approx(math.exp(statistics.fmean(d) + h))
    assert est["half_width"] == pytest.approx(math.expm1(h))
    assert ps.log_ratios(r, n) == pytest.approx(d)


def test_t_interval_needs_two_rounds() -> None:
    assert ps.t_interval([])["ratio"] is None
    one = ps.t_interval([0.1])
    assert one["ratio"] == pytest.approx(math.exp(0.1)) and one["lo"] is None and one["half_width"] is None


def test_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    """Simulated paired rounds with a known ratio 0.97 and a round effect shared by R and N:
    the t interval covers 0.97 in about 95% of 2,000 experiments of 6 rounds each."""
    rng = random.Random(7)
    covered = 0
    trials = 2000
    for _ in range(trials):
        r, n = [], []
        for _ in range(6):
            shared = rng.lognormvariate(0, 0.2)  # the round's own speed: cancels in the ratio
            n.append(1000 * shared * rng.lognormvariate(0, 0.01))
            r.append(970 * shared * rng.lognormvariate(0, 0.01))
        est = ps.t_interval(ps.log_ratios(r, n))
        covered += est["lo"] <= 0.97 <= est["hi"]
    assert 0.93 <= covered / trials <= 0.97


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible() -> None:
    d = [0.01, -0.02, 0.015, 0.0, 0.005, -0.01]
    lo, hi = ps.bootstrap_interval(d, seed=3) or (0, 0)
    assert lo < math.exp(statistics.fmean(d)) < hi
    assert ps.bootstrap_interval(d, seed=3) == (lo, hi)
    assert ps.bootstrap_interval(d[:2]) is None


@pytest.mark.parametrize(
    "lo,hi,goal,want",
    [
        (0.985, 0.995, (">=", 0.98), "met"),
        (0.975, 0.99, (">=", 0.98), "undecided"),
        (0.95, 0.979, (">=", 0.98), "missed"),
        (0.99, 1.019, ("<=", 1.02), "met"),
        (1.00, 1.05, ("<=", 1.02), "undecided"),
        (1.021, 1.05, ("<=", 1.02), "missed"),
        (None, None, ("<=", 1.02), "no interval"),
    ],
)
def test_verdicts(lo: float | None, hi: float | None, goal: tuple[str, float], want: str) -> None:
    assert ps.verdict({"lo": lo, "hi": hi}, goal) == want


def test_estimate_reports_everything_raw() -> None:
    r = [990.0, 1000.0, 985.0, 1002.0]
    n = [1000.0, 1001.0, 1000.0, 1000.0]
    est = ps.estimate(r, n, "tok_s")
    assert est["rounds"] == 4
    assert est["round_ratios"] == [round(a / b, 5) for a, b in zip(r, n, strict=True)]
    assert est["ci95_t"][0] < est["ratio"] < est["ci95_t"][1]
    assert est["goal"] == ">= 0.98"
    assert est["verdict"] in ("met", "undecided")
    assert est["ci95_bootstrap"] is not None
    other = ps.estimate([1.0], [1.0], "other")
    assert other["ci95_t"] is None and "verdict" not in other


def test_need_is_infinite_until_two_rounds_then_the_widest_figure_over_target() -> None:
    assert ps.need({"a": [1.0]}, {"a": [1.0]}, 0.015) == math.inf
    tight = ([100.0, 100.1, 99.9, 100.0], [100.0] * 4)
    loose = ([110.0, 90.0, 105.0, 95.0], [100.0] * 4)
    got = ps.need({"tight": tight[0], "loose": loose[0]}, {"tight": tight[1], "loose": loose[1]}, 0.015)
    assert got == pytest.approx(ps.t_interval(ps.log_ratios(*loose))["half_width"] / 0.015)
    assert got > 1 > ps.need({"tight": tight[0]}, {"tight": tight[1]}, 0.015)


def test_next_level_fills_minimum_rounds_then_serves_the_widest() -> None:
    needs = {"0.5": 3.0, "0.8": 0.5, "0.95": 2.0, "sat": 9.0}
    assert ps.next_level(needs, {"0.5": 2, "0.8": 1, "0.95": 2, "sat": 2}, min_rounds=2, max_rounds=10) == "0.8"
    rounds = {"0.5": 4, "0.8": 4, "0.95": 4, "sat": 4}
    # sat is widest but comes last: the open-loop levels first
    assert ps.next_level(needs, rounds, min_rounds=4, max_rounds=10, last_priority=["sat"]) == "0.5"
    assert ps.next_level(needs, {**rounds, "0.5": 10}, min_rounds=4, max_rounds=10, last_priority=["sat"]) == "0.95"
    done = {"0.5": 0.9, "0.8": 0.5, "0.95": 0.99, "sat": 9.0}
    assert ps.next_level(done, rounds, min_rounds=4, max_rounds=10, last_priority=["sat"]) == "sat"
    assert ps.next_level(done, {**rounds, "sat": 10}, min_rounds=4, max_rounds=10, last_priority=["sat"]) is None


def test_abba_balances_order_every_four_rounds() -> None:
    orders = [ps.abba(k) for k in range(8)]
    assert orders[:4] == [("R", "N"), ("N", "R"), ("N", "R"), ("R", "N")]
    assert sum(o[0] == "R" for o in orders) == 4
