"""Run with vLLM's Python: the crash-dump lines vLLM itself prints for one decode step.

Reads the step as JSON on stdin (what ``collector.sim.vllm_logs.DumpStep`` holds), builds
vLLM's real objects (``SchedulerOutput``, ``MultiKVConnectorMetadata`` over
``NixlConnectorMetadata`` and ``HiSparseConnectorMetadata`` with ``SparseKVRowMirror``s,
``SchedulerStats`` with the connectors' stats) and prints, as JSON, the text of
``prepare_object_to_dump(scheduler_output)`` and of ``%s`` of the stats: the two messages of
vLLM's ``dump_engine_exception`` (``vllm/logging_utils/dump_input.py``).
"""

from __future__ import annotations

import json
import sys

from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import HiSparseConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.logging_utils.dump_input import prepare_object_to_dump
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.hisparse.types import SparseKVOffloadCommand, SparseKVRowMirror
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats


def build(step: dict) -> tuple[SchedulerOutput, SchedulerStats]:
    reqs = step["requests"]
    ids = [r["id"] for r in reqs]
    nixl = NixlConnectorMetadata()
    nixl.scheduler_clock = step["scheduler_clock"]
    hisparse = HiSparseConnectorMetadata(
        command=SparseKVOffloadCommand(page_transfers=[]),
        host_block_copies=(),
        source_block_ids=(),
        row_mirrors={r["id"]: tuple(SparseKVRowMirror(tuple(m[0]), m[1], m[2]) for m in r["mirrors"]) for r in reqs},
        all_context_pages_resident=False,
        residency_updates={},
    )
    out = SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(
            req_ids=ids,
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[None] * len(ids),
            num_computed_tokens=[r["computed"] for r in reqs],
            num_output_tokens=[r["output"] for r in reqs],
        ),
        num_scheduled_tokens={i: 1 for i in ids},
        total_num_scheduled_tokens=len(ids),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        preempted_req_ids=set(),
        kv_connector_metadata=MultiKVConnectorMetadata(metadata=(nixl, hisparse)),
        num_common_prefix_blocks=[0],
    )
    stats = SchedulerStats(
        num_running_reqs=len(ids),
        num_waiting_reqs=step["waiting"],
        step_counter=step["step"],
        kv_cache_usage=step["kv_cache_usage"],
        prefix_cache_stats=PrefixCacheStats(),
        kv_connector_stats=step["kv_connector_stats"],
    )
    return out, stats


if __name__ == "__main__":
    out, stats = build(json.load(sys.stdin))
    json.dump({"scheduler_output": prepare_object_to_dump(out), "scheduler_stats": str(stats)}, sys.stdout)
