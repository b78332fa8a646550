"""Plans from workloads: phases by concurrency level, barriers, prefix reuse; and the prompts."""

from __future__ import annotations

import pytest
from replay_helpers import ramp_workload

from collector.replay.plan import PlanError, build_plan, levels
from collector.replay.prompts import PromptFactory
from collector.replay.report import plan_text


def test_a_closed_loop_ramp_becomes_its_levels() -> None:
    plan = build_plan(ramp_workload(((1, 4), (2, 6), (4, 12), (8, 16), (16, 32)), crash_in_last_after=10))
    assert [(p.concurrency, len(p.requests)) for p in plan.phases] == [(1, 4), (2, 6), (4, 12), (8, 16), (16, 26)]
    assert [p.barrier for p in plan.phases] == [False, True, True, True, True]
    crash = plan.crash_phase
    assert crash is not None and crash.concurrency == 16
    assert (crash.original("finished"), crash.original("failed_by_crash")) == (10, 16)
    assert plan.crashed and plan.fault_offset is not None and plan.fault_offset > plan.phases[-1].start
    assert {r.prompt_len for r in plan.requests} == {32000} and {r.max_tokens for r in plan.requests} == {2000}
    assert plan.requests[0].offset == 0.0
    assert all(r.prefix_of is None for r in plan.requests)  # no cache hits: nothing shared


def test_requests_arriving_after_a_fault_known_to_the_second_keep_their_level() -> None:
    # short requests (a GPU step's pace): a whole round of the last level arrives in the second
    # that vLLM's log time truncates; those requests are in flight until the death, not before
    wl = ramp_workload(((1, 2), (2, 4), (4, 8), (8, 24)), duration=0.6, crash_in_last_after=9, fault_known_early_by=0.95)
    plan = build_plan(wl)
    assert [p.concurrency for p in plan.phases] == [1, 2, 4, 8], [(p.concurrency, len(p.requests)) for p in plan.phases]
    assert plan.crash_phase is not None and plan.crash_phase.concurrency == 8
    assert plan.fault_offset is not None and plan.fault_offset >= max(r.offset for r in plan.requests)


def test_levels_count_ends_before_arrivals_at_the_same_time() -> None:
    # b arrives exactly when a ends: a closed-loop client of one
    assert levels([0.0, 1.0], [1.0, 2.0], 3.0) == [1, 1]
    assert levels([0.0, 0.5], [1.0, None], 3.0) == [2, 2]


def test_cache_hits_become_reused_prefixes_of_an_earlier_prompt() -> None:
    plan = build_plan(ramp_workload(((1, 3),), prompt_len=300, cached=128))
    first, second, third = plan.requests
    assert first.prefix_of is None
    assert (second.prefix_of, second.prefix_len) == (0, 128) and (third.prefix_of, third.prefix_len) == (1, 128)
    prompts = PromptFactory(plan, seed=7)
    p0, p1, p2 = (prompts.prompt(r) for r in plan.requests)
    assert [len(p) for p in (p0, p1, p2)] == [300, 300, 300]
    assert p1[:128] == p0[:128] and p2[:128] == p1[:128]
    assert p1[128:160] != p0[128:160]  # fresh after the shared prefix


def test_fresh_prompts_share_no_block_and_stay_in_the_token_range() -> None:
    plan = build_plan(ramp_workload(((4, 40),), prompt_len=64))
    prompts = PromptFactory(plan, seed=1, low=10, high=1000)
    built = [prompts.prompt(r) for r in plan.requests]
    assert len({tuple(p[:16]) for p in built}) == len(built)  # even the first 16 tokens differ
    assert all(10 <= t < 1000 for p in built for t in p)
    # a prompt shorter than the marker still has its exact length
    tiny = build_plan(ramp_workload(((1, 1),), prompt_len=3))
    assert len(PromptFactory(tiny, seed=1).prompt(tiny.requests[0])) == 3
    # another seed, other content
    assert PromptFactory(plan, seed=2).prompt(plan.requests[0]) != built[0]


def test_no_workload_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="no workload"):
        build_plan(None)
    empty = ramp_workload(((1, 1),))
    empty["requests"]["columns"]["prompt_len"] = [None]
    with pytest.raises(PlanError, match="prompt length"):
        build_plan(empty)


def test_the_plan_text_shows_the_ramp_and_the_fault() -> None:
    plan = build_plan(ramp_workload(((1, 2), (16, 20)), crash_in_last_after=5), source={"id": 7, "engine": "decode-0"})
    text = plan_text(plan)
    assert "plan of snapshot 7 (decode-0, the engine died): 22 requests" in text
    rows = [line.split() for line in text.splitlines()[2:4]]
    assert rows[0][:3] == ["1", "C1", "2"] and rows[1][:3] == ["2", "C16", "20"]
    assert "32000/32000/32000" in text and "2000/2000/2000" in text
    assert text.splitlines()[3].endswith("5/15  <- fault")
