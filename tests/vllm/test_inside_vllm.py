"""The recorder against vLLM's real classes: runs inside_vllm.py with the vLLM virtualenv's
python (``FLIGHTREC_VLLM_PYTHON``) and checks what it reports."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_env import run_inside  # tests/vllm is on sys.path (pytest prepend import mode)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_inside("inside_vllm.py")


def test_stat_logger_records_scheduler_and_iteration_stats(report: dict[str, Any]) -> None:
    first, second = report["steps"]
    assert (first["step"], first["running"], first["waiting"], first["kv_cache_usage"]) == (41, 5, 4, 0.032)
    assert first["waiting_by_reason"] == {"capacity": 3, "deferred": 1}
    assert (first["prefix_cache_queries"], first["prefix_cache_hits"]) == (640, 128)
    assert (first["generation_tokens"], first["preemptions"], first["finished"]) == (5, 2, 1)
    assert first["connector"]["NixlConnector.num_failed_transfers"] == 1  # a delta, summed
    assert first["connector"]["NixlConnector.transfer_duration.count"] == 2
    # a finished request is counted; its end reaches the sidecar once, in the workload record
    assert first["finished_requests"] == []
    # iteration stats that came alone ride on the next step; a zero step_counter is counted on
    assert (second["step"], second["running"], second["generation_tokens"], second["finished"]) == (42, 4, 5, 1)


def test_fingerprint_from_a_real_vllm_config(report: dict[str, Any]) -> None:
    fp = report["fingerprint"]
    assert fp["vllm_version"] == "0.32.0"
    assert fp["connectors"] == ["MultiConnector", "NixlConnector", "OffloadingConnector"]
    assert fp["offload_cpu_bytes"] == 137438953472 and fp["kv_role"] == "kv_both"
    assert fp["host_pool_gib"] is None and "import_prefix_via_host" not in fp  # no HiSparse here
    assert fp["block_size"] == 64 and fp["tensor_parallel_size"] == 1 and fp["max_model_len"] == 2048
    assert fp["cuda_graph_mode"] == "NONE" and isinstance(fp["compilation_mode"], str)
    assert fp["pod_uid"] == "7f3c2b1a-9d4e-4c5f-8a6b-0e1d2c3b4a59"  # the rings join their pod's engine by it
    assert fp["env"]["NCCL_NET_PLUGIN"] == "libnccl-net-test.so" and fp["env"]["VLLM_API_KEY"] == "***"


def test_a_recorder_fault_disables_it_once_and_never_reaches_vllm(report: dict[str, Any]) -> None:
    fault = report["fault"]
    assert fault["raised"] is None
    assert "field moved" in fault["failed"]
    assert len([m for m in fault["messages"] if "disabled" in m]) == 1
    assert "inside%2Fdp1.stats." in " ".join(report["files"])  # engine index 1 has its own ring


def test_scheduler_rows_and_step_numbers_under_async_order(report: dict[str, Any]) -> None:
    sched = report["sched"]
    assert sched["stamps"] == [1, 2]  # each step's stats get that step's number
    s1, s2 = sched["steps"]
    assert s1["step"] == 1 and s2["step"] == 2
    assert [r[:3] for r in s1["rows"]] == [["cmpl-r0-0-abcdef12", 100, 100], ["cmpl-r1-0-abcdef12", 101, 101], ["cmpl-r2-0-abcdef12", 102, 102]]
    assert [(r[2], r[3], r[4]) for r in s2["rows"]] == [(101, 1, "running"), (102, 1, "running"), (103, 1, "running")]
