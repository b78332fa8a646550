"""vLLM's log line formats, as the simulated engines write them (pure string building).

A line is ``(PROCESS pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``, as vLLM 0.32
prints with its process prefix; the incident's frames are those of PRODUCT.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from collector.sim.scenario import SimRequest


def line(process: str, pid: int, level: str, ts: float, where: str, msg: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(ts))
    return f"({process} pid={pid}) {level} {stamp} [{where}] {msg}"


def throughput(engine_idx: int, prompt_tps: float, gen_tps: float, running: int, waiting: int,
               kv_usage: float, prefix_hit: float) -> str:  # fmt: skip
    return (
        f"Engine {engine_idx:03d}: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
        f"Avg generation throughput: {gen_tps:.1f} tokens/s, Running: {running} reqs, "
        f"Waiting: {waiting} reqs, GPU KV cache usage: {kv_usage * 100:.1f}%, "
        f"Prefix cache hit rate: {prefix_hit * 100:.1f}%"
    )


TRACEBACK_TP0 = [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 1058, in worker_busy_loop',
    "    output = func(*args, **kwargs)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/model_runner.py", line 1928, in execute_model',
    "    self.kv_connector.finish_forward()",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/kv_connector.py", line 96, in finish_forward',
    "    self._connector.finish_forward()",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py", line 310, in finish_forward',
    "    c.finish_forward()",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/hisparse/connector.py", line 247, in finish_forward',
    "    self._worker.finish_forward()",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py", line 831, in finish_forward',
    "    self._finish_mirror_phase(self._forward_ready_event)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py", line 823, in _finish_mirror_phase',
    "    state.event.synchronize()",
    "torch.AcceleratorError: CUDA error: unspecified launch failure",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
]

TRACEBACK_TP1 = [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 1058, in worker_busy_loop',
    "    output = func(*args, **kwargs)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/model_runner.py", line 1887, in execute_model',
    "    model_output = self.cudagraph_manager.run_fullgraph(batch_desc)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/cudagraph_utils.py", line 667, in run_fullgraph',
    "    super().run_fullgraph(desc)",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/cudagraph_utils.py", line 486, in run_fullgraph',
    "    self.graphs[desc].replay()",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/async_utils.py", line 168, in get_output',
    "    copy_event.synchronize()",
    "torch.AcceleratorError: CUDA error: unspecified launch failure",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
]


def worker_failure(process: str, pid: int, ts: float, frames: Sequence[str]) -> list[str]:
    head = line(process, pid, "ERROR", ts, "multiproc_executor.py:1063", "WorkerProc hit an exception.")
    return [head] + [line(process, pid, "ERROR", ts, "multiproc_executor.py:1063", f) for f in frames]


def crash_dump(pid: int, ts: float, step: int, running: Sequence[SimRequest], waiting: int, kv_usage: float,
               model: str, version: str) -> list[str]:  # fmt: skip
    ids = [r.request_id for r in running]
    computed = [r.context_len - 1 for r in running]
    sched = (
        "SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData("
        f"req_ids={ids!r}, resumed_req_ids=set(), new_token_ids=[], all_token_ids={{}}, "
        f"new_block_ids={[None] * len(ids)!r}, num_computed_tokens={computed!r}, "
        f"num_output_tokens={[r.output for r in running]!r}), "
        f"num_scheduled_tokens={ {i: 1 for i in ids}!r}, total_num_scheduled_tokens={len(ids)}, "
        "scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, "
        f"num_common_prefix_blocks=[0], finished_req_ids=[], free_encoder_mm_hashes=[], "
        "structured_output_request_ids=[], grammar_bitmask=null, kv_connector_metadata=null)"
    )
    stats = (
        f"SchedulerStats(num_running_reqs={len(running)}, num_waiting_reqs={waiting}, step_counter={step}, "
        f"current_wave=0, kv_cache_usage={kv_usage!r}, prefix_cache_stats=PrefixCacheStats(reset=False, "
        "requests=0, queries=0, hits=0, preempted_requests=0, preempted_queries=0, preempted_hits=0), "
        "connector_prefix_cache_stats=None, spec_decoding_stats=None, kv_connector_stats=None, "
        "waiting_lora_adapters={}, running_lora_adapters={}, num_corrupted_reqs=0)"
    )
    p = "EngineCore_DP0"
    return [
        line(p, pid, "ERROR", ts, "dump_input.py:72", f"Dumping input data for V1 LLM engine (v{version}) with config: model='{model}', ..."),
        line(p, pid, "ERROR", ts, "dump_input.py:79", f"Dumping scheduler output for model execution: {sched}"),
        line(p, pid, "ERROR", ts, "dump_input.py:81", f"Dumping scheduler stats: {stats}"),
        line(p, pid, "ERROR", ts, "core.py:866", "EngineCore encountered a fatal error."),
        line(p, pid, "ERROR", ts, "core.py:866", "Traceback (most recent call last):"),
        line(p, pid, "ERROR", ts, "core.py:866", '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 857, in run_engine_core'),
        line(p, pid, "ERROR", ts, "core.py:866", "    engine_core.run_busy_loop()"),
        line(p, pid, "ERROR", ts, "core.py:866", "RuntimeError: Worker failed with error 'CUDA error: unspecified launch failure', please check the stack trace above for the root cause"),
    ]  # fmt: skip


def api_server_death(pid: int, ts: float) -> list[str]:
    p = "APIServer"
    return [
        line(p, pid, "ERROR", ts, "async_llm.py:525", "AsyncLLM output_handler failed."),
        line(p, pid, "ERROR", ts, "async_llm.py:525", "Traceback (most recent call last):"),
        line(p, pid, "ERROR", ts, "async_llm.py:525", '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 481, in output_handler'),
        line(p, pid, "ERROR", ts, "async_llm.py:525", "    outputs = await engine_core.get_output_async()"),
        line(p, pid, "ERROR", ts, "async_llm.py:525", "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."),
        line(p, pid, "INFO", ts, "launcher.py:110", "Shutting down FastAPI HTTP server."),
    ]  # fmt: skip


def kmsg_xid(seq: int, usec: int, bus: str, xid: int, pid: int, name: str = "python3") -> str:
    """A /dev/kmsg record, as in the shared H200 capture."""
    return f"4,{seq},{usec},c;NVRM: Xid (PCI:{bus}): {xid}, pid={pid}, name={name}, channel 0x0000000a"
