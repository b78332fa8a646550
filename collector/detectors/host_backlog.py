"""The HiSparse host side falling behind: a backlog that grows while the load does not.

Host-mirror rows per step are copy work that follows the batch size (vLLM schedules
``SparseKVRowMirror`` spans for each request it runs), so their count says nothing about a
leak. What does (``hisparse/stats.py``, ``hisparse/coordinator.py``):
- host blocks held per running request (the coordinator's ``req_to_blocks``, the recorder's
  ``host_blocks`` column) growing while the running set is steady: blocks not freed;
- ``pending_page_transfers`` (a level) growing: host-to-device page copies queueing up;
- ``host_cache_usage_perc`` (a level) near full: the pinned host pool is exhausted.
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState, mean
from collector.detectors.config import HostBacklogThresholds
from collector.detectors.series import Point, window
from collector.model import Severity

NAME = "host_backlog"
ACTION = (
    "take a snapshot: the HiSparse host side is falling behind; check the host pool size "
    "(host_pool_gib), pending page transfers and the connector's free path"
)


def _quarters(points: Sequence[Point]) -> tuple[float, float]:
    q = max(1, len(points) // 4)
    return mean(v for _, v in points[:q]) or 0.0, mean(v for _, v in points[-q:]) or 0.0


def detect_host_backlog(
    host_blocks: Sequence[Point],
    running: Sequence[Point],
    pending: Sequence[Point],
    cache_usage: Sequence[Point],
    *,
    now: float,
    labels: dict[str, str],
    thr: HostBacklogThresholds,
) -> DetectorState:
    """Per step: ``host_blocks`` (sum over running requests), ``running``, and HiSparse's
    ``pending_page_transfers`` and ``host_cache_usage_perc`` (0..1 or 0..100) levels."""
    start = now - thr.window_s
    usage = window(cache_usage, start)
    if usage:
        last = usage[-1][1]
        last = last / 100.0 if last > 1.0 else last
        if last >= thr.cache_full:
            return DetectorState(NAME, Severity.WARNING, f"host cache {last:.0%} full", ACTION, last, labels, now)
    load = window(running, start)
    blocks = window(host_blocks, start)
    if len(blocks) >= thr.min_points and len(load) >= thr.min_points:
        load_first, load_last = _quarters(load)
        b_first, b_last = _quarters(blocks)
        if load_first > 0 and load_last > 0 and b_first > 0:
            per_first, per_last = b_first / load_first, b_last / load_last
            steady = abs(load_last / load_first - 1.0) <= thr.load_tolerance
            growth = per_last / per_first
            if steady and growth >= thr.growth_ratio:
                return DetectorState(
                    NAME,
                    Severity.WARNING,
                    f"host blocks per running request grew x{growth:.2f} in {thr.window_s:g}s "
                    f"({per_first:.0f} -> {per_last:.0f}) with the load steady ({load_first:.1f} -> {load_last:.1f})",
                    ACTION,
                    growth,
                    labels,
                    now,
                )
    backlog = window(pending, start)
    if len(backlog) >= thr.min_points:
        p_first, p_last = _quarters(backlog)
        if p_last >= thr.pending_min and p_last >= p_first * thr.growth_ratio:
            return DetectorState(
                NAME,
                Severity.WARNING,
                f"pending page transfers grew {p_first:.0f} -> {p_last:.0f} in {thr.window_s:g}s",
                ACTION,
                p_last,
                labels,
                now,
            )
    return DetectorState(NAME, Severity.OK, "host side keeping up", labels=labels, ts=now)
