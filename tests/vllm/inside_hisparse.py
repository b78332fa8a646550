"""Run by the vLLM virtualenv's python (from test_hisparse_real.py): the HiSparse and NIXL
readers on vLLM's real classes. A real HiSparseCoordinator is built on CPU over a real
HiSparseSourceManager and host block pool; a step's real SchedulerOutput carries a real
MultiKVConnectorMetadata with a real HiSparseConnectorMetadata of real SparseKVRowMirrors; the
connector stats are vLLM's real HiSparse/NIXL stats objects, aggregated the way MultiConnector
does. Prints what the recorder wrote as one JSON object. Not a test module itself."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

MARKER = "FLIGHTREC-RESULT "
work = Path(tempfile.mkdtemp(prefix="flightrec-hisparse-"))
os.environ["FLIGHTREC_RECORDER_DIR"] = str(work / "rec")
os.environ["FLIGHTREC_ENGINE_NAME"] = "hs"

import torch  # noqa: E402
from tiny_llama import tiny_llama  # noqa: E402 - beside this script (its folder is first on sys.path)
from vllm.compilation.cuda_graph import CUDAGraphStat  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.config.attention import HiSparseConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (  # noqa: E402
    HiSparseConnector,
    HiSparseConnectorMetadata,
    HiSparseConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats import HiSparseKVConnectorStats  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector,
    MultiKVConnectorMetadata,
    MultiKVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import HiSparseSourceManager  # noqa: E402
from vllm.v1.hisparse.coordinator import HiSparseCoordinator  # noqa: E402
from vllm.v1.hisparse.types import SparseKVRowMirror  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from collector.channel.blocks import RequestBlock, RequestRecords  # noqa: E402
from collector.channel.codec import FLAG_HOST_BLOCKS, FLAG_MIRROR, STEP_HEAD, decode_many  # noqa: E402
from collector.channel.ringfile import RingReader  # noqa: E402
from collector.model import StepRecord  # noqa: E402
from collector.vllm.hisparse import find_hisparse  # noqa: E402
from collector.vllm.plugin import FlightRecorderStatLogger  # noqa: E402
from collector.vllm.scheduler import _SchedRecorder  # noqa: E402

BLOCK = 64
result: dict[str, Any] = {}

# -- the config: MultiConnector(NIXL + HiSparse), HiSparse's attention config -----------------
model = tiny_llama(work / "model")
cfg = EngineArgs(
    model=str(model), load_format="dummy", skip_tokenizer_init=True, max_model_len=2048, dtype="bfloat16", block_size=BLOCK
).create_engine_config()
# Set after validation: vLLM refuses HiSparse off CUDA ("HiSparse currently requires NVIDIA CUDA.")
cfg.kv_transfer_config = KVTransferConfig(
    kv_connector="MultiConnector",
    kv_role="kv_both",
    kv_buffer_device="cuda",
    kv_connector_extra_config={
        "connectors": [
            {
                "kv_connector": "NixlConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"backends": ["UCX"], "num_threads": 4, "kv_lease_duration": 30},
            },
            {"kv_connector": "HiSparseConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"host_pool_gib": 128}},
        ]
    },
)
cfg.attention_config.hisparse_config = HiSparseConfig(device_buffer_size=2048, eager_host_mirror=True)

# -- a real coordinator over a real host manager and host pool --------------------------------
spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)], hisparse_host_num_blocks=32)
host = HiSparseSourceManager(spec, BlockPool(num_gpu_blocks=64, enable_caching=False, hash_block_size=BLOCK), False, 0, BLOCK)
coordinator = HiSparseCoordinator(kv, (host,), 4096, num_reprefillable_tokens=0)
hs_sched = HiSparseConnectorScheduler(async_speculative=False)
hs_sched.bind_coordinator(coordinator)
# The connector objects themselves need a CUDA KV layout to construct: the real classes, with
# the scheduler side vLLM's constructor would have set.
hisparse = HiSparseConnector.__new__(HiSparseConnector)
hisparse.connector_scheduler = hs_sched
multi = MultiConnector.__new__(MultiConnector)
multi._connectors = [hisparse]
result["found"] = type(find_hisparse(multi)).__name__

reqs = []
for i, n in enumerate((300, 130, 20)):
    r = Request(f"cmpl-h{i}-0-abcdef12", list(range(1, n + 1)), SamplingParams(max_tokens=8), None)
    r.status = RequestStatus.RUNNING
    r.num_computed_tokens = n
    reqs.append(r)
host.allocate_new_blocks(reqs[0].request_id, 300, 300)  # 5 host blocks
host.allocate_new_blocks(reqs[1].request_id, 130, 130)  # 3 host blocks; the third request: none
result["host_usage"] = coordinator.get_host_block_pool().get_usage()

# -- the scheduler side: one step with HiSparse row mirrors, one without metadata -------------
rec = _SchedRecorder(cfg, connector=multi)
row_mirrors = {
    reqs[0].request_id: (SparseKVRowMirror((0, 64), 0, 3), SparseKVRowMirror((128,), 3, 2)),
    reqs[1].request_id: (SparseKVRowMirror((0,), 0, 1),),
}  # the third request was not scheduled this step
meta = HiSparseConnectorMetadata(
    command=None, host_block_copies=(), source_block_ids=(), row_mirrors=row_mirrors, all_context_pages_resident=True, residency_updates={}
)
so = SchedulerOutput.make_empty()
so.kv_connector_metadata = MultiKVConnectorMetadata(metadata=(KVConnectorMetadata(), meta))
rec.scheduled(reqs, so)
rec.scheduled(reqs, SchedulerOutput.make_empty())  # a step whose metadata we cannot read
result["req_to_blocks_untouched"] = sorted(host.req_to_blocks)  # .get never inserts
host.allocate_new_blocks(reqs[2].request_id, 20, 20)  # the third request gets its first host block
rec.scheduled(reqs, so)


def sched_blocks() -> list[RequestBlock]:
    """The scheduler ring's R records in order, each with its columns whole (a record that kept
    its running set's columns gets them from the full record before it)."""
    out = []
    for path in (work / "rec").glob("hs.sched.*.ring"):
        requests = RequestRecords()
        out += [b for p in RingReader(path).read() if p[:1] == b"R" and (b := requests.block(p)) is not None]
    return out


def columns(block: RequestBlock) -> dict[str, Any]:
    from array import array

    n, flags, cols = block.n, block.flags, block.cols
    pos = n * 17
    out: dict[str, Any] = {"step": block.step, "flags": flags}
    for name, bit in (("mirror_rows", FLAG_MIRROR), ("host_blocks", FLAG_HOST_BLOCKS)):
        if flags & bit:
            col = array("i")
            col.frombytes(cols[pos : pos + 4 * n])
            out[name] = list(col)
            pos += 4 * n
    out["ids"] = block.ids.decode().split("\0")
    return out


result["steps"] = [columns(b) for b in sched_blocks()]
result["flags"] = {"mirror": FLAG_MIRROR, "host_blocks": FLAG_HOST_BLOCKS}

# -- connector stats as vLLM hands them to stat loggers --------------------------------------
hs_stats = hs_sched.get_kv_connector_stats()  # the real host-usage level from the coordinator
assert isinstance(hs_stats, HiSparseKVConnectorStats)
hs_stats.record_snapshot(hits=120, misses=8, host_to_device_bytes=4096)
later = HiSparseKVConnectorStats()
later.record_host_usage(0.5, 3)
later.record_snapshot(hits=10, misses=2, host_to_device_bytes=1024)
hs_stats.aggregate(later)  # levels keep the last observation, deltas extend
nixl = NixlKVConnectorStats()
nixl.record_failed_transfer()
nixl.record_failed_transfer()
multi_stats = MultiKVConnectorStats(data={"NixlConnector": nixl, "HiSparseConnector": hs_stats})
plugin = FlightRecorderStatLogger(cfg, 0)
plugin.log_engine_initialized()
plugin.record(SchedulerStats(num_running_reqs=3, kv_cache_usage=0.032, kv_connector_stats=multi_stats.to_dict()), None)
# a step of an engine started with --enable-logging-iteration-details and --cudagraph-metrics:
# vLLM's real detail classes, read back through the sidecar's own decoder
plugin.record(
    SchedulerStats(
        num_running_reqs=3,
        kv_cache_usage=0.033,
        iteration_details=SchedulerIterationDetails(
            iteration_index=7, num_ctx_requests=1, num_ctx_tokens=512, num_generation_requests=2, num_generation_tokens=2, elapsed_ms=12.5
        ),
        cudagraph_stats=CUDAGraphStat(num_unpadded_tokens=3, num_padded_tokens=8, num_paddings=5, runtime_mode="FULL"),
    ),
    None,
)
stats = [p for path in (work / "rec").glob("hs.stats.*.ring") for p in RingReader(path).read()]
decoded = [obs for _, obs, _ in decode_many(stats, engine="hs") if isinstance(obs, StepRecord)]
result["details"] = [d.details for d in decoded]
result["connector"] = next(json.loads(p[1 + STEP_HEAD.size :]) for p in stats if p[:1] == b"S")["connector"]
fp = next(json.loads(p[1:]) for p in stats if p[:1] == b"J" and b'"t":"fp"' in p)["facts"]
result["fingerprint"] = {
    k: fp.get(k)
    for k in (
        "host_pool_gib",
        "host_pool_size",
        "hisparse",
        "nixl",
        "kv_buffer_device",
        "connectors",
        "cuda_graph_mode",
        "import_prefix_via_host",
        "server_pid",
    )
}
result["has_import_key"] = "import_prefix_via_host" in fp

# -- and a real engine config with HiSparse: what vLLM says on this machine -------------------
try:
    EngineArgs(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=2048,
        dtype="bfloat16",
        kv_transfer_config=cfg.kv_transfer_config,
    ).create_engine_config()
    result["engine_config_error"] = None
except Exception as exc:  # noqa: BLE001
    result["engine_config_error"] = f"{type(exc).__name__}: {exc}"
print(MARKER + json.dumps(result, default=str))
