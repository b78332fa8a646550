"""Comparing two workloads within the stated tolerances."""

from __future__ import annotations

from replay_helpers import ramp_workload

from collector.replay.compare import compare
from collector.replay.plan import build_plan

RAMP = ((1, 2), (2, 4), (4, 8), (8, 12))


def test_the_same_ramp_is_the_same_load_with_the_fault_at_the_same_point() -> None:
    a = build_plan(ramp_workload(RAMP, crash_in_last_after=4))
    b = build_plan(ramp_workload(RAMP, crash_in_last_after=4, duration=12.0))  # slower, same shape
    cmp = compare(a, b)
    assert cmp.same and cmp.same_fault_point is True, cmp.notes


def test_a_different_load_is_not_the_same() -> None:
    a = build_plan(ramp_workload(RAMP, crash_in_last_after=4))
    assert not compare(a, build_plan(ramp_workload(RAMP, crash_in_last_after=4, prompt_len=16000))).same_prompts
    assert not compare(a, build_plan(ramp_workload(RAMP, crash_in_last_after=4, max_tokens=100))).same_max_tokens
    lower = ((1, 2), (2, 4), (4, 8), (4, 12))  # the last level never reaches 8
    assert not compare(a, build_plan(ramp_workload(lower, crash_in_last_after=4))).same_concurrency


def test_a_fault_elsewhere_or_none_is_not_the_same_point() -> None:
    a = build_plan(ramp_workload(RAMP, crash_in_last_after=4))
    later = compare(a, build_plan(ramp_workload(RAMP, crash_in_last_after=10)))
    assert later.same_fault_point is False and "after 10" in later.notes[-1]
    assert compare(a, build_plan(ramp_workload(RAMP))).same_fault_point is False
    assert compare(build_plan(ramp_workload(RAMP)), build_plan(ramp_workload(RAMP))).same_fault_point is None


def test_the_replays_snapshot_is_its_engines_fault_not_an_anomaly_taken_before_the_death() -> None:
    from collector.replay.source import pick

    items = [
        {"id": 7, "engine": "decode-0", "trigger_kind": "cuda_error", "created_at": 1.0},  # the original
        {"id": 8, "engine": "decode-0", "trigger_kind": "anomaly", "created_at": 2.0},  # during the replay
        {"id": 9, "engine": "prefill-0", "trigger_kind": "xid", "created_at": 2.5},  # another engine
    ]
    assert pick(items, exclude=7, engine="decode-0", final=False) is None  # keep waiting for the death
    assert pick(items, exclude=7, engine="decode-0", final=True)["id"] == 8  # type: ignore[index]
    items.append({"id": 10, "engine": "decode-0", "trigger_kind": "engine_fatal", "created_at": 3.0})
    assert pick(items, exclude=7, engine="decode-0", final=False)["id"] == 10  # type: ignore[index]
    assert pick(items, exclude=7, engine="other-site-name", final=False)["id"] == 9  # type: ignore[index]
