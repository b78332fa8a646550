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


@pytest.mark.parametrize("run", [1_765_000_000_123, 0, 9_999_999_999_999_999_999])
def test_a_run_id_is_carried_in_the_name(run: int) -> None:
    name = ring_file_name("decode-0/dp1", "sched", 7, run)
    assert name.count(".") == 4
    assert parse_ring_file_name(name) == RingName("decode-0/dp1", "sched", 7, run)


def test_a_restart_under_the_same_pids_gets_another_name() -> None:
    # a container's pids repeat across restarts; its run id (the start time) does not
    assert ring_file_name("vllm-1", "stats", 1, 1_765_000_000_000) != ring_file_name("vllm-1", "stats", 1, 1_765_000_012_000)


@pytest.mark.parametrize("name", ["a.stats.1.x.ring", "a.stats.1..ring", "a.stats.1.².ring", "a.stats.1.2.3.ring", f"a.stats.1.{'9' * 20}.ring"])
def test_a_bad_run_is_not_ours(name: str) -> None:
    assert parse_ring_file_name(name) is None
