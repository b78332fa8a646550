"""Mirror rows, host blocks, connector stats and the fingerprint, read from vLLM's real HiSparse
and NIXL classes (inside_hisparse.py, run with vLLM's python)."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_env import run_inside  # tests/vllm is on sys.path (pytest prepend import mode)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_inside("inside_hisparse.py")


def test_mirror_rows_per_request_from_the_steps_connector_metadata(report: dict[str, Any]) -> None:
    assert report["found"] == "HiSparseConnector"  # found among MultiConnector's sub-connectors
    first, second, _ = report["steps"]
    assert first["flags"] == report["flags"]["mirror"] | report["flags"]["host_blocks"]
    # 3 + 2 rows for the first request, 1 for the second, 0 for the one not scheduled this step
    assert first["mirror_rows"] == [5, 1, 0]
    assert second["mirror_rows"] == [-1, -1, -1]  # no HiSparse metadata in the step: unknown, not 0


def test_host_blocks_per_request_from_the_coordinator(report: dict[str, Any]) -> None:
    first, second, third = report["steps"]
    assert first["host_blocks"] == [5, 3, 0] and second["host_blocks"] == [5, 3, 0]
    assert third["host_blocks"] == [5, 3, 1]  # a list that grew is counted again
    assert report["req_to_blocks_untouched"] == ["cmpl-h0-0-abcdef12", "cmpl-h1-0-abcdef12"]  # never indexed


def test_connector_stats_by_connector_with_their_meaning(report: dict[str, Any]) -> None:
    c = report["connector"]
    # deltas summed over the two reports, levels the last observation
    assert (c["HiSparseConnector.cache_hits"], c["HiSparseConnector.cache_misses"]) == (130, 10)
    assert c["HiSparseConnector.host_to_device_bytes"] == 5120
    assert (c["HiSparseConnector.host_cache_usage_perc"], c["HiSparseConnector.pending_page_transfers"]) == (0.5, 3)
    assert c["NixlConnector.num_failed_transfers"] == 2
    assert c["NixlConnector.transfer_duration.count"] == 0
    assert "mirror_rows" not in c  # no connector stat is called that: nothing invented


def test_iteration_details_and_the_cudagraph_stat_reach_the_sidecars_step(report: dict[str, Any]) -> None:
    plain, detailed = report["details"]  # a step without the flags' objects, then one with them
    assert plain == {}
    assert detailed["cudagraph"] == {"num_unpadded_tokens": 3, "num_padded_tokens": 8, "num_paddings": 5, "runtime_mode": "FULL"}
    assert detailed["iteration"]["iteration_index"] == 7 and detailed["iteration"]["elapsed_ms"] == 12.5


def test_fingerprint_from_the_real_config(report: dict[str, Any]) -> None:
    fp = report["fingerprint"]
    assert (fp["host_pool_gib"], fp["host_pool_size"]) == (128.0, 128 * 2**30)
    assert fp["hisparse"] == {"eager_host_mirror": True, "device_buffer_size": 2048}
    assert fp["nixl"] == {"backends": ["UCX"], "kv_lease_duration": 30, "num_threads": 4}
    assert fp["kv_buffer_device"] == "cuda"
    assert fp["connectors"] == ["MultiConnector", "NixlConnector", "HiSparseConnector"]
    assert report["has_import_key"] is False


def test_vllm_refuses_hisparse_off_cuda(report: dict[str, Any]) -> None:
    # Why no real HiSparse engine runs on the CPU build: vLLM's own config check.
    assert "HiSparse currently requires NVIDIA CUDA." in report["engine_config_error"]
