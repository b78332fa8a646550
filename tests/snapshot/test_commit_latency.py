"""Commit latency: recorded once (the commit queue), read by /metrics and the benchmarks."""

from __future__ import annotations

import math

import pytest

from collector.snapshot.latency import CommitLatency


def test_buckets_are_cumulative_and_bad_values_are_not_kept() -> None:
    lat = CommitLatency((0.1, 1.0), recent_kept=2)
    for s in (0.05, 0.5, 0.5, 3.0, -1.0, float("nan")):
        lat.observe(s)
    assert lat.buckets() == [(0.1, 1), (1.0, 3), (math.inf, 4)]
    assert lat.count == 4 and lat.sum == pytest.approx(4.05)
    assert lat.recent() == [0.5, 3.0]  # the newest, bounded


def test_the_committer_reads_the_queues_record(tmp_path) -> None:
    from collector.snapshot.commit import CommitQueue

    q = CommitQueue(repo=None, spool_dir=tmp_path, window_s=1.0)  # type: ignore[arg-type]
    q.latency.observe(0.2)
    assert q.latency.recent() == [0.2]
