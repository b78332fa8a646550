from __future__ import annotations

import pytest

from collector.channel.naming import RingName, parse_ring_file_name, ring_file_name


@pytest.mark.parametrize(
    ("engine", "role", "pid"),
    [("decode-0", "stats", 42), ("decode-0/dp1", "sched", 7), ("a.b:c", "stats", 1), ("vllm-123", "sched", 99)],
)
def test_names_round_trip(engine: str, role: str, pid: int) -> None:
    name = ring_file_name(engine, role, pid)
    assert "/" not in name and name.count(".") == 3
    assert parse_ring_file_name(name) == RingName(engine, role, pid)


@pytest.mark.parametrize("name", ["x.ring", "a.stats.ring", "a.stats.pid.ring", ".stats.1.ring", "a.stats.1.ring.tmp"])
def test_other_files_are_not_ours(name: str) -> None:
    assert parse_ring_file_name(name) is None
