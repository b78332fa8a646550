"""Cost of the in-engine recorder per engine step, beside vLLM's own PrometheusStatLogger.

Run with the vLLM virtualenv's python (it imports vLLM)::

    $FLIGHTREC_VLLM_PYTHON bench/bench_recorder.py [--repeat 2000]

For N = 16, 64, 256 running requests it builds one step's real ``SchedulerStats`` and
``IterationStats`` (N generated tokens, one inter-token latency per request, as a decode step
has) and real engine-core ``Request`` objects, then prints the median and p99 of:

- ``prometheus``: vLLM's ``PrometheusStatLogger.record`` on those stats;
- ``stat_logger``: ``FlightRecorderStatLogger.record`` on the same stats (encode + ring write);
- ``per_request``: the RecordingScheduler's per-step work on the N requests (read the columns,
  encode, ring write), with the request counters changing every step as in decode;
- ``hisparse``: the same with a HiSparse connector: each request's mirror rows from a real
  ``HiSparseConnectorMetadata`` in the step's ``MultiKVConnectorMetadata`` and its host blocks
  from a real ``HiSparseCoordinator`` (``--host-blocks`` per request, 500 = a 32,000-token
  context in 64-token blocks);
- ``hisparse_grow``: the same while the host lists grow as decode makes them: each step one
  request in 64 gets one more host block (a 64-token block fills every 64 decode steps), through
  the host manager's own ``allocate_new_blocks``;
- ``per_request_churn``: ``per_request`` while the running set changes at every step (one
  request finishes and a new one joins at the end, as vLLM's ``running`` list does): every
  record is a full one, and the columns that follow the running set are read again.

While the running set holds, a record carries only what the step changed (``FLAG_KEPT``,
``collector.channel.codec``); ``per_request_churn`` is the cost when it never holds.

The rings are written where the recorder writes them by default, a folder in /dev/shm (RAM)
when there is one (``--dir`` to choose another). Figures go into BENCHMARKS.md by hand; nothing
here asserts a time. ``--json FILE`` writes them with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def vllm_config(folder: Path) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    (folder / "config.json").write_text(json.dumps(TINY))
    args = EngineArgs(model=str(folder), load_format="dummy", skip_tokenizer_init=True, max_model_len=2048, dtype="bfloat16")
    return args.create_engine_config()


def step_stats(n: int, step: int) -> tuple[Any, Any]:
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    sched = SchedulerStats(
        num_running_reqs=n,
        num_waiting_reqs=3,
        kv_cache_usage=0.4,
        step_counter=step,
        prefix_cache_stats=PrefixCacheStats(requests=0, queries=0, hits=0),
    )
    it = IterationStats()
    it.num_generation_tokens = n
    it.inter_token_latencies_iter = [0.025] * n
    return sched, it


def requests(n: int) -> list[Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    out = []
    for i in range(n):
        r = Request(f"cmpl-{i:032x}-0-{i:08x}", list(range(300 + i)), SamplingParams(max_tokens=2000), None)
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = 300 + i
        out.append(r)
    return out


def hisparse_setup(reqs: list[Any], blocks_per_request: int, spare_blocks: int = 0) -> tuple[Any, Any, Any]:
    """A MultiConnector holding a HiSparseConnector bound to a real coordinator whose host
    manager holds ``blocks_per_request`` blocks for each request, and a step output whose
    metadata mirrors two row spans per request; and the host manager (to grow a request's
    blocks as decode does)."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (
        HiSparseConnector,
        HiSparseConnectorMetadata,
        HiSparseConnectorScheduler,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector, MultiKVConnectorMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.single_type_kv_cache_manager import HiSparseSourceManager
    from vllm.v1.hisparse.coordinator import HiSparseCoordinator
    from vllm.v1.hisparse.types import SparseKVRowMirror
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    total = len(reqs) * blocks_per_request + spare_blocks + 1
    spec = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)], hisparse_host_num_blocks=total)
    host = HiSparseSourceManager(spec, BlockPool(num_gpu_blocks=64, enable_caching=False, hash_block_size=64), False, 0, 64)
    coordinator = HiSparseCoordinator(kv, (host,), 1 << 20, num_reprefillable_tokens=0)
    hs_sched = HiSparseConnectorScheduler(async_speculative=False)
    hs_sched.bind_coordinator(coordinator)
    hisparse = HiSparseConnector.__new__(HiSparseConnector)  # its constructor needs a CUDA KV layout
    hisparse.connector_scheduler = hs_sched
    multi = MultiConnector.__new__(MultiConnector)
    multi._connectors = [hisparse]
    for r in reqs:
        host.allocate_new_blocks(r.request_id, blocks_per_request * 64, blocks_per_request * 64)
    mirrors = {r.request_id: (SparseKVRowMirror((0,), 0, 1), SparseKVRowMirror((64,), 1, 1)) for r in reqs}
    meta = HiSparseConnectorMetadata(None, (), (), mirrors, True, {})
    out = SchedulerOutput.make_empty()
    out.kv_connector_metadata = MultiKVConnectorMetadata(metadata=(KVConnectorMetadata(), meta))
    return multi, out, host


def timed(fn: Any, repeat: int, setup: Any = None) -> tuple[float, float]:
    """Median and p99 of ``fn()`` in microseconds; ``setup()`` runs before each call, untimed."""
    for _ in range(min(200, repeat)):
        if setup is not None:
            setup()
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument("--host-blocks", type=int, default=500, help="HiSparse host blocks per request")
    ap.add_argument("--dir", default=None, help="where the rings go (default: a new folder in /dev/shm, else the temp folder)")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    work = Path(tempfile.mkdtemp(prefix="flightrec-bench-"))
    shm = Path("/dev/shm")
    ring_dir = a.dir or tempfile.mkdtemp(prefix="flightrec-bench-rings-", dir=shm if shm.is_dir() else None)
    os.environ["FLIGHTREC_RECORDER_DIR"] = str(Path(ring_dir) / "rec")
    os.environ["FLIGHTREC_ENGINE_NAME"] = "bench"
    (work / "model").mkdir()
    cfg = vllm_config(work / "model")

    from vllm.v1.metrics.loggers import PrometheusStatLogger

    from collector.vllm.plugin import FlightRecorderStatLogger
    from collector.vllm.scheduler import _SchedRecorder

    prom = PrometheusStatLogger(cfg, [0])
    ours = FlightRecorderStatLogger(cfg, 0)
    sched = _SchedRecorder(cfg)
    import vllm

    print(f"vLLM {vllm.__version__}, Python {sys.version.split()[0]}, {a.repeat} steps each; microseconds per step")
    print(f"{'running':>8} {'what':<17} {'median':>8} {'p99':>8} {'vs prometheus':>14}")
    figures: list[dict[str, Any]] = []
    for n in [int(s) for s in a.sizes.split(",")]:
        counter = [0]

        stats: list[Any] = [None, None]

        def new_stats(n: int = n) -> None:
            counter[0] += 1
            stats[:] = step_stats(n, counter[0])

        def prom_step() -> None:
            prom.record(stats[0], stats[1], engine_idx=0)

        def ours_step() -> None:
            ours.record(stats[0], stats[1], engine_idx=0)

        reqs = requests(n)
        from vllm.v1.core.sched.output import SchedulerOutput

        outputs = [SchedulerOutput.make_empty()]  # what schedule() returns: a real one, not a stand-in

        def decode_step(reqs: list[Any] = reqs) -> None:
            for r in reqs:  # what a decode step does to every running request
                r.num_computed_tokens += 1
                r.append_output_token_ids(7)

        def sched_step(reqs: list[Any] = reqs) -> None:
            sched.scheduled(reqs, outputs[0])
            sched.updating(outputs[0])

        hs_reqs = requests(n)
        connector, hs_out, _ = hisparse_setup(hs_reqs, a.host_blocks)
        hs_sched = _SchedRecorder(cfg, connector=connector)
        grow_reqs = requests(n)
        steps = a.repeat + min(200, a.repeat)
        grow_connector, grow_out, grow_host = hisparse_setup(grow_reqs, a.host_blocks, spare_blocks=steps * n // 64 + n)
        grow_sched = _SchedRecorder(cfg, connector=grow_connector)
        grow_counter = [0]

        def grow_decode_step(reqs: list[Any] = grow_reqs) -> None:
            decode_step(reqs)
            grow_counter[0] += 1
            for r in reqs[grow_counter[0] % 64 :: 64]:  # one request in 64 fills its block
                have = len(grow_host.req_to_blocks[r.request_id])
                grow_host.allocate_new_blocks(r.request_id, (have + 1) * 64, (have + 1) * 64)

        def grow_step() -> None:
            grow_sched.scheduled(grow_reqs, grow_out)
            grow_sched.updating(grow_out)

        def hs_decode_step(reqs: list[Any] = hs_reqs) -> None:
            decode_step(reqs)

        def hs_step(reqs: list[Any] = hs_reqs) -> None:
            hs_sched.scheduled(reqs, hs_out)
            hs_sched.updating(hs_out)

        churn_reqs = requests(n)
        churn_spare = requests(n + 1)
        churn_counter = [0]

        def churn_decode_step(reqs: list[Any] = churn_reqs, spare: list[Any] = churn_spare) -> None:
            decode_step(reqs)
            churn_counter[0] += 1
            done = reqs.pop(churn_counter[0] % len(reqs))  # a request finishes; another joins at the end
            spare.append(done)
            reqs.append(spare.pop(0))

        churn_sched = _SchedRecorder(cfg)

        def churn_step(reqs: list[Any] = churn_reqs) -> None:
            churn_sched.scheduled(reqs, outputs[0])
            churn_sched.updating(outputs[0])

        p_med, p_99 = timed(prom_step, a.repeat, new_stats)
        o_med, o99 = timed(ours_step, a.repeat, new_stats)
        s_med, s99 = timed(sched_step, a.repeat, decode_step)
        h_med, h99 = timed(hs_step, a.repeat, hs_decode_step)
        g_med, g99 = timed(grow_step, a.repeat, grow_decode_step)
        c_med, c99 = timed(churn_step, a.repeat, churn_decode_step)
        for what, med, tail in (
            ("prometheus", p_med, p_99),
            ("stat_logger", o_med, o99),
            ("per_request", s_med, s99),
            ("hisparse", h_med, h99),
            ("hisparse_grow", g_med, g99),
            ("per_request_churn", c_med, c99),
        ):
            print(f"{n:>8} {what:<17} {med:>8.1f} {tail:>8.1f} {med / p_med:>14.3f}")
            figures.append({"running": n, "what": what, "median_us": round(med, 2), "p99_us": round(tail, 2)})
        for s in (hs_sched, grow_sched, churn_sched):
            if s.channel.failed:
                print("recorder disabled during the run:", s.channel.failed)
                return 1
    if ours.channel.failed or sched.channel.failed:
        print("recorder disabled during the run:", ours.channel.failed or sched.channel.failed)
        return 1
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}; rings in {ring_dir}")
    if a.json:
        by_running: dict[str, dict[str, Any]] = {}
        for f in figures:
            by_running.setdefault(str(f["running"]), {})[f["what"]] = {"median_us": f["median_us"], "p99_us": f["p99_us"]}
        doc = {
            "vllm": vllm.__version__,
            "repeat": a.repeat,
            "load_before": load_before,
            "load_after": load_after,
            "figures": figures,
            "by_running": by_running,
        }
        Path(a.json).write_text(json.dumps(doc, indent=1))
    shutil.rmtree(ring_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
