"""Host-mirror rows growing while the load is steady: the connector is holding rows it should free."""

from __future__ import annotations

from collections.abc import Sequence

from collector.detectors.base import DetectorState, Level, mean
from collector.detectors.config import MirrorRowsThresholds
from collector.detectors.series import Point, window

NAME = "mirror_rows_growth"


def detect_mirror_rows_growth(
    rows: Sequence[Point], running: Sequence[Point], *, now: float, labels: dict[str, str], thr: MirrorRowsThresholds
) -> DetectorState:
    """``rows``: total mirror rows per step; ``running``: running requests per step."""
    recent = window(rows, now - thr.window_s)
    load = window(running, now - thr.window_s)
    if len(recent) < thr.min_points or len(load) < thr.min_points:
        return DetectorState(NAME, Level.OK, "not enough mirror-row points", labels=labels, ts=now)
    quarter = max(1, len(recent) // 4)
    lq = max(1, len(load) // 4)
    rows_first = mean(v for _, v in recent[:quarter]) or 0.0
    rows_last = mean(v for _, v in recent[-quarter:]) or 0.0
    load_first = mean(v for _, v in load[:lq]) or 0.0
    load_last = mean(v for _, v in load[-lq:]) or 0.0
    if rows_first <= 0 or load_first <= 0:
        return DetectorState(NAME, Level.OK, "no rows or no load at the window's start", labels=labels, ts=now)
    growth = rows_last / rows_first
    load_change = abs(load_last / load_first - 1.0)
    if growth < thr.growth_ratio or load_change > thr.load_tolerance:
        return DetectorState(NAME, Level.OK, f"rows x{growth:.2f}, load change {load_change:.0%}", labels=labels,
                             ts=now, value=growth)
    return DetectorState(
        NAME,
        Level.WARNING,
        f"mirror rows grew x{growth:.2f} in {thr.window_s:g}s ({rows_first:.0f} -> {rows_last:.0f}) "
        f"with running requests steady ({load_first:.1f} -> {load_last:.1f})",
        "take a snapshot: the KV connector may be leaking host-mirror rows; check its free path",
        growth,
        labels,
        now,
    )
