"""Paired rounds, R against N: the ratio of a figure with its 95% confidence interval, and which
load level needs another round.

Each round runs the same load on R (the recorder) and on N (no recorder), one after the other,
in ABBA order over rounds. A round gives one log-ratio d = ln(R / N) per figure; the estimate is
exp(mean d) (the geometric mean of the round ratios) and its interval comes from Student's t on
the d's (primary; rounds are the unit, so a slow round, a hot GPU, a noisy neighbour, moves R and
N of that round together and cancels) and, as a check that needs no normality, from a
percentile bootstrap of the same mean over rounds.

Standard library only: the GPU scripts run in whatever Python has vLLM (scipy's
``stats.t.ppf`` gives the same quantiles; it is not in every such Python).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# Student's t, 0.975 quantile (a two-sided 95% interval), by degrees of freedom: the standard
# table (scipy.stats.t.ppf(0.975, df) to three decimals).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` degrees of freedom (df >= 1): the table to 30, then
    the Cornish-Fisher expansion around the normal quantile (within 0.001 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def log_ratios(r: Sequence[float | None], n: Sequence[float | None]) -> list[float]:
    """ln(R / N) of each round where both figures were measured and positive (a round missing
    either side is left out, not counted as equal)."""
    out = []
    for a, b in zip(r, n, strict=True):
        if a is not None and b is not None and a > 0 and b > 0:
            out.append(math.log(a / b))
    return out


def t_interval(d: Sequence[float]) -> dict[str, Any]:
    """The paired estimate from round log-ratios ``d``: ratio exp(mean), its 95% interval
    exp(mean -+ t * sd / sqrt(n)), and the interval's half-width as a fraction of the ratio
    (exp(h) - 1, the wider, upper side). Fewer than 2 rounds: no interval (None)."""
    k = len(d)
    out: dict[str, Any] = {"n": k, "ratio": None, "lo": None, "hi": None, "half_width": None, "sd_log": None}
    if k == 0:
        return out
    mean = statistics.fmean(d)
    out["ratio"] = math.exp(mean)
    if k < 2:
        return out
    sd = statistics.stdev(d)
    h = t975(k - 1) * sd / math.sqrt(k)
    out.update(lo=math.exp(mean - h), hi=math.exp(mean + h), half_width=math.expm1(h), sd_log=sd)
    return out


def bootstrap_interval(d: Sequence[float], resamples: int = 4000, seed: int = 1) -> tuple[float, float] | None:
    """Percentile bootstrap (95%) of exp(mean d), resampling rounds with replacement. With fewer
    than 3 rounds there is nothing to resample from (None)."""
    k = len(d)
    if k < 3:
        return None
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(d, k=k)) for _ in range(resamples))
    lo = means[int(0.025 * (resamples - 1))]
    hi = means[int(math.ceil(0.975 * (resamples - 1)))]
    return math.exp(lo), math.exp(hi)


# the goals of the cost measurement: tokens/s R/N at least 0.98; p99 TTFT and ITL R/N at most 1.02
GOALS: dict[str, tuple[str, float]] = {
    "tok_s": (">=", 0.98),
    "ttft_p99_ms": ("<=", 1.02),
    "itl_p99_ms": ("<=", 1.02),
}


def verdict(est: Mapping[str, Any], goal: tuple[str, float]) -> str:
    """``met`` when the whole interval is on the goal's side, ``missed`` when the whole interval
    is on the other, ``undecided`` when it straddles the goal, ``no interval`` before 2 rounds."""
    lo, hi = est.get("lo"), est.get("hi")
    if lo is None or hi is None:
        return "no interval"
    op, bound = goal
    if op == ">=":
        return "met" if lo >= bound else "missed" if hi < bound else "undecided"
    return "met" if hi <= bound else "missed" if lo > bound else "undecided"


def estimate(r: Sequence[float | None], n: Sequence[float | None], metric: str, seed: int = 1) -> dict[str, Any]:
    """Everything the result says of one figure at one level: the round ratios, the t interval,
    the bootstrap interval and the goal's verdict."""
    d = log_ratios(r, n)
    est = t_interval(d)
    boot = bootstrap_interval(d, seed=seed)
    out: dict[str, Any] = {
        "metric": metric,
        "ratio": _r(est["ratio"]),
        "ci95_t": None if est["lo"] is None else [_r(est["lo"]), _r(est["hi"])],
        "half_width_pct": None if est["half_width"] is None else round(100 * est["half_width"], 3),
        "ci95_bootstrap": None if boot is None else [_r(boot[0]), _r(boot[1])],
        "rounds": est["n"],
        "round_ratios": [_r(math.exp(x)) for x in d],
        "sd_log": None if est["sd_log"] is None else round(est["sd_log"], 6),
    }
    if metric in GOALS:
        out["goal"] = f"{GOALS[metric][0]} {GOALS[metric][1]}"
        out["verdict"] = verdict(est, GOALS[metric])
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def need(r_by_metric: Mapping[str, Sequence[float | None]], n_by_metric: Mapping[str, Sequence[float | None]], target: float) -> float:
    """How far a level is from done: the largest interval half-width among its figures divided
    by ``target`` (0.015: +-1.5%); above 1 the level wants more rounds; infinite while a figure
    has fewer than 2 usable rounds."""
    worst = 0.0
    for metric, r in r_by_metric.items():
        est = t_interval(log_ratios(r, n_by_metric[metric]))
        if est["half_width"] is None:
            return math.inf
        worst = max(worst, est["half_width"] / target)
    return worst


def next_level(
    needs: Mapping[str, float],
    rounds: Mapping[str, int],
    *,
    min_rounds: int,
    max_rounds: int,
    last_priority: Sequence[str] = (),
) -> str | None:
    """The level that gets the next round: first every level up to ``min_rounds`` (the one with
    fewest rounds first), then the one furthest from its target among those not yet within it
    and under ``max_rounds``; levels in ``last_priority`` only once no other level wants a
    round. None: every level is within its target or at its cap."""
    order = list(needs)
    short = [lv for lv in order if rounds.get(lv, 0) < min_rounds]
    if short:
        return min(short, key=lambda lv: (rounds.get(lv, 0), order.index(lv)))
    open_ = [lv for lv in order if needs[lv] > 1.0 and rounds.get(lv, 0) < max_rounds]
    first = [lv for lv in open_ if lv not in last_priority]
    pick = first or open_
    if not pick:
        return None
    return max(pick, key=lambda lv: (needs[lv], -order.index(lv)))


def abba(k: int) -> tuple[str, str]:
    """Which server goes first in a level's k-th round (0-based): R N, N R, N R, R N, ... so a
    drift in time (the GPU warming, caches filling) falls on both alike over every 4 rounds."""
    return ("R", "N") if k % 4 in (0, 3) else ("N", "R")
