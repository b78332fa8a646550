"""Snapshot commit latency, from a fault's trigger to its snapshot's first commit: recorded in
this one place (the commit queue calls ``observe`` once per first commit) and read by whoever
reports it (the /metrics histogram, a benchmark's percentiles).

Usage::

    latency = CommitLatency()
    latency.observe(0.2)
    latency.buckets()   # [(0.01, 0), ..., (inf, 1)]: cumulative counts, Prometheus' form
    latency.recent()    # [0.2]: the newest values, for percentiles
"""

from __future__ import annotations

import math
import threading
from collections import deque

__all__ = ["BUCKETS", "CommitLatency"]

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # seconds (+Inf added)
RECENT_KEPT = 1000


class CommitLatency:
    """Counts per bucket, their sum and the newest values; thread-safe (a scrape reads it from a
    worker thread while the loop records)."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS, *, recent_kept: int = RECENT_KEPT) -> None:
        self.bounds = (*sorted(buckets), math.inf)
        self._counts = [0] * len(self.bounds)
        self._sum = 0.0
        self._recent: deque[float] = deque(maxlen=recent_kept)
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        """One commit. A negative value (a clock step) or NaN says nothing and is not kept."""
        if not seconds >= 0:
            return
        i = next(i for i, b in enumerate(self.bounds) if seconds <= b)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds
            self._recent.append(seconds)

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound, commits at or below it), the last bound +Inf."""
        with self._lock:
            counts = list(self._counts)
        out, total = [], 0
        for bound, n in zip(self.bounds, counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)

    @property
    def sum(self) -> float:
        with self._lock:
            return self._sum

    def recent(self) -> list[float]:
        """The newest values (at most ``recent_kept``), oldest first."""
        with self._lock:
            return list(self._recent)
