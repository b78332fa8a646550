"""Scrape target gone: a known engine's /metrics has not answered for ``after_s``."""

from __future__ import annotations

from collector.detectors.base import DetectorState
from collector.detectors.config import ScrapeGoneThresholds
from collector.model import Severity

NAME = "scrape_target_gone"


def detect_scrape_gone(last_scrape: float | None, *, now: float, labels: dict[str, str], thr: ScrapeGoneThresholds) -> DetectorState:
    if last_scrape is None:
        return DetectorState(NAME, Severity.OK, "never scraped", labels=labels, ts=now)
    age = now - last_scrape
    if age < thr.after_s:
        return DetectorState(NAME, Severity.OK, f"last scrape {age:.1f}s ago", labels=labels, ts=now, value=age)
    return DetectorState(
        NAME,
        Severity.CRITICAL,
        f"no successful /metrics scrape for {age:.0f}s",
        "check whether the engine process is alive (a dead engine exits with code 0) and its snapshot",
        age,
        labels,
        now,
    )
