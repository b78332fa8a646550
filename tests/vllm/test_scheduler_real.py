"""RecordingScheduler on vLLM's real scheduler classes (inside_scheduler.py, run with vLLM's
python): it keeps AsyncScheduler when async scheduling is on, records through its code path
with the steps numbered right in async order, and writes one workload record per request end."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_env import run_inside  # tests/vllm is on sys.path (pytest prepend import mode)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_inside("inside_scheduler.py")


def test_async_scheduling_keeps_vllms_async_scheduler(report: dict[str, Any]) -> None:
    run = report["async"]
    assert run["class"] == "collector.vllm.scheduler.RecordingScheduler"  # what --scheduler-cls names
    assert run["is_async"] and run["instance_mro"][:4] == ["RecordingAsyncScheduler", "RecordingScheduler", "AsyncScheduler", "Scheduler"]
    assert run["placeholders"][:2] == [1, 2]  # AsyncScheduler._update_after_schedule ran
    assert run["scheduler_base"] == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    assert run["async_fact"] is True


def test_sync_scheduling_stays_on_scheduler(report: dict[str, Any]) -> None:
    run = report["sync"]
    assert not run["is_async"] and run["instance_mro"][:2] == ["RecordingScheduler", "Scheduler"]
    assert run["placeholders"] == [0] * 5
    assert run["scheduler_base"] == "vllm.v1.core.sched.scheduler.Scheduler"


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_steps_are_numbered_the_same_on_both_sides(report: dict[str, Any], mode: str) -> None:
    run = report[mode]
    if mode == "async":  # update_from_output of step n runs after schedule of step n+1
        assert run["order"][:5] == ["schedule1", "schedule2", "update1", "schedule3", "update2"]
    assert run["stamps"] == [1, 2, 3, 4, 5]  # each step's SchedulerStats carry that step
    assert run["stats_steps"] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in run["rows"]] == [1, 2, 3, 4, 5]
    first = run["rows"][0]["reqs"]
    assert [(r[1], r[2]) for r in first] == [(40, 40), (70, 70)]  # the prompts, prefilled in step 1
    # decode steps: one more computed token per step; outputs lag one step under async
    assert [r[2] for r in run["rows"][1]["reqs"]] == [41, 71]
    assert [r[3] for r in run["rows"][2]["reqs"]] == ([1, 1] if mode == "async" else [2, 2])


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_cudagraph_use_of_each_step_rides_in_the_step_extras(report: dict[str, Any], mode: str) -> None:
    extras = report[mode]["stats_raw_extras"]
    assert extras[0]["cudagraph"] == {"num_unpadded_tokens": 2, "num_padded_tokens": 8, "num_paddings": 6, "runtime_mode": "FULL"}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_workload_records_once_per_request(report: dict[str, Any], mode: str) -> None:
    wl = report[mode]["workload"]
    arrive = [w for w in wl if w["ev"] == "arrive"]
    end = [w for w in wl if w["ev"] == "end"]
    assert [(w["id"], w["ts"], w["prompt_len"], w["max_tokens"], w["n"], w["ignore_eos"], w["has_stop"]) for w in arrive] == [
        (f"cmpl-{mode}0-0-abcdef12", 1000.0, 40, 3, 1, True, False),
        (f"cmpl-{mode}1-0-abcdef12", 1001.0, 70, 3, 1, True, False),
    ]
    # no prefix caching in this engine: nothing was cached, a measured 0 (not unknown)
    assert [(w["output_len"], w["finish"], w["cached_tokens"]) for w in end] == [(3, "length", 0)] * 2


def test_prefix_cache_hits_are_each_requests_tokens_found_computed_at_its_first_schedule(report: dict[str, Any]) -> None:
    # vLLM's Request keeps no cached-token figure to its end (0.32 and 0.33): the recorder takes
    # it from the step's NewRequestData, as the replay's prefix reuse needs
    ends = {e["id"]: e["cached_tokens"] for e in report["prefix_ends"]}
    assert ends == {"cmpl-prefix0-0-abcdef12": 0, "cmpl-prefix1-0-abcdef12": 48, "cmpl-prefix2-0-abcdef12": 0}
