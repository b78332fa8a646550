"""Wedged engine: it holds requests (running or waiting) and has not stepped for far longer than
its own pace, while vLLM's ``/health`` may still answer 200 (an NCCL deadlock, a kernel that
never finishes, a blocked thread, a SIGSTOPped engine core).

The threshold follows the engine: ``pace_factor`` times its longest step gap of the last
``pace_window_s`` (a long prefill or a slow chunk it took before is its pace, not a hang), never
under ``floor_s`` nor over ``ceiling_s``; an engine seen only through ``/metrics`` moves at most
once a scrape, so never under three scrape intervals either. Pure: the watch
(``collector.detectors.wedge_watch``) keeps the gaps and the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.detectors.config import WedgeThresholds

NAME = "engine_wedged"
ACTION = (
    "open the snapshot: the engine's stacks show where each process waits (NCCL, a CUDA sync, a lock); restart the engine if it does not move again"
)


def threshold_s(longest_gap_s: float | None, thr: WedgeThresholds, *, scrape_interval_s: float | None = None) -> float:
    """Seconds without a step, requests held, after which the engine is wedged."""
    floor = thr.floor_s if scrape_interval_s is None else max(thr.floor_s, 3 * scrape_interval_s)
    return min(max(thr.ceiling_s, floor), max(floor, thr.pace_factor * (longest_gap_s or 0.0)))


@dataclass(frozen=True, slots=True)
class WedgeVerdict:
    wedged: bool
    stuck_s: float  # seconds since it last moved while holding requests (0: holds none)
    threshold_s: float
    reason: str


def judge_wedge(
    *,
    held: int | None,
    moved_at: float | None,
    busy_since: float | None,
    now: float,
    longest_gap_s: float | None,
    thr: WedgeThresholds,
    scrape_interval_s: float | None = None,
) -> WedgeVerdict:
    """``held``: requests running + waiting at the newest reading; ``moved_at``: its last step (or
    counters' change); ``busy_since``: when it was first seen holding requests in this busy
    spell (the clock starts at the later of the two: an idle engine's last step is old news)."""
    limit = threshold_s(longest_gap_s, thr, scrape_interval_s=scrape_interval_s)
    if not held or busy_since is None:
        return WedgeVerdict(False, 0.0, limit, "holds no request")
    start = busy_since if moved_at is None else max(moved_at, busy_since)
    stuck = max(0.0, now - start)
    pace = f"{thr.pace_factor:g} x its longest recent step gap {longest_gap_s:.1f} s" if longest_gap_s else "no long step gap seen"
    why = f"threshold {limit:.1f} s: {pace}, floor {thr.floor_s:g} s, ceiling {thr.ceiling_s:g} s"
    if stuck < limit:
        return WedgeVerdict(False, stuck, limit, f"{held} requests held, last step {stuck:.1f} s ago ({why})")
    return WedgeVerdict(True, stuck, limit, f"{held} requests held and no step for {stuck:.1f} s ({why})")
