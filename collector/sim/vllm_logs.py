"""vLLM's log line formats, as the simulated engines write them (pure string building).

A line is ``(PROCESS pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``, as vLLM 0.32
prints with its process prefix; the incident's frames are those of PRODUCT.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def line(process: str, pid: int, level: str, ts: float, where: str, msg: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(ts))
    return f"({process} pid={pid}) {level} {stamp} [{where}] {msg}"


def throughput(engine_idx: int, prompt_tps: float, gen_tps: float, running: int, waiting: int, kv_usage: float, prefix_hit: float) -> str:
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


class Obj:
    """A vLLM object as its crash dump walks it: the class name and its ``__dict__`` in order,
    or the text of its ``anon_repr()`` where vLLM's class has one."""

    __slots__ = ("anon", "fields", "name")

    def __init__(self, name: str, fields: Sequence[tuple[str, Any]] = (), anon: str | None = None) -> None:
        self.name, self.fields, self.anon = name, list(fields), anon


def dump(obj: Any) -> str:
    """``vllm.logging_utils.dump_input.prepare_object_to_dump``, over plain values and ``Obj``.

    Strings in single quotes, dict keys bare, lists, tuples and sets as ``[...]``, objects as
    ``Name(field=value, ...)``, the rest as JSON (``null``, ``false``). vLLM joins a dict's
    items through a set, so their order in a real dump is arbitrary; here it is the insertion
    order."""
    if isinstance(obj, str):
        return f"'{obj}'"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}: {dump(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple, set, frozenset)):
        return "[" + ", ".join(dump(v) for v in obj) + "]"
    if isinstance(obj, Obj):
        if obj.anon is not None:
            return obj.anon
        return f"{obj.name}(" + ", ".join(f"{k}={dump(v)}" for k, v in obj.fields) + ")"
    try:
        return json.dumps(obj)
    except (TypeError, ValueError):
        return repr(obj)


def py_repr(obj: Any) -> str:
    """A dataclass's ``repr`` (what ``%s`` of ``SchedulerStats`` prints), over ``Obj``."""
    if isinstance(obj, Obj):
        return f"{obj.name}(" + ", ".join(f"{k}={py_repr(v)}" for k, v in obj.fields) + ")"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {py_repr(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(py_repr(v) for v in obj) + "]"
    return repr(obj)


@dataclass(frozen=True)
class RowMirror:
    """``vllm.v1.hisparse.types.SparseKVRowMirror``: one contiguous span of resident rows the
    HiSparse worker copies into the host cache this step."""

    source_starts: tuple[int, ...]
    destination_start: int
    num_rows: int


@dataclass
class DumpStep:
    """What vLLM's crash dump prints of the step that was executing: the running requests
    (ids, computed and output tokens), this step's row mirrors per request, and the stats."""

    step: int
    req_ids: list[str]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]
    row_mirrors: dict[str, tuple[RowMirror, ...]]
    waiting: int
    kv_cache_usage: float
    kv_connector_stats: dict[str, dict[str, list[Any]]] | None
    scheduler_clock: float = 0.0


def _cached_request_data(d: DumpStep) -> Obj:
    # CachedRequestData.anon_repr (vllm/v1/core/sched/output.py): Python reprs, no spaces
    n = len(d.req_ids)
    return Obj(
        "CachedRequestData",
        anon=(
            f"CachedRequestData(req_ids={d.req_ids!r},resumed_req_ids=set(),new_token_ids_lens=[],"
            f"all_token_ids_lens={{}},new_block_ids={[None] * n!r},num_computed_tokens={d.num_computed_tokens!r},"
            f"num_output_tokens={d.num_output_tokens!r})"
        ),
    )


def scheduler_output(d: DumpStep) -> Obj:
    """The decode step's ``SchedulerOutput`` (vLLM 0.32's fields, in order), its connector
    metadata a ``MultiKVConnectorMetadata`` over NIXL's and HiSparse's."""
    nixl = Obj(
        "NixlConnectorMetadata",
        [
            ("reqs_to_recv", {}),
            ("reqs_to_save", {}),
            ("reqs_to_send", {}),
            ("scheduler_clock", d.scheduler_clock),
            ("reqs_in_batch", set()),
            ("reqs_not_processed", set()),
            ("heartbeat_by_engine", {}),
            ("push_registrations", {}),
            ("push_finished_blocks", {}),
        ],
    )
    mirrors = {
        rid: tuple(
            Obj("SparseKVRowMirror", [("source_starts", m.source_starts), ("destination_start", m.destination_start), ("num_rows", m.num_rows)])
            for m in ms
        )
        for rid, ms in d.row_mirrors.items()
    }
    hisparse = Obj(
        "HiSparseConnectorMetadata",
        [
            ("command", Obj("SparseKVOffloadCommand", [("page_transfers", [])])),
            ("host_block_copies", ()),
            ("source_block_ids", ()),
            ("row_mirrors", mirrors),
            ("all_context_pages_resident", False),
            ("residency_updates", {}),
        ],
    )
    return Obj(
        "SchedulerOutput",
        [
            ("scheduled_new_reqs", []),
            ("scheduled_cached_reqs", _cached_request_data(d)),
            ("num_scheduled_tokens", {i: 1 for i in d.req_ids}),
            ("total_num_scheduled_tokens", len(d.req_ids)),
            ("scheduled_spec_decode_tokens", {}),
            ("scheduled_encoder_inputs", {}),
            ("finished_req_ids", set()),
            ("free_encoder_mm_hashes", []),
            ("scheduled_encoder_input_stats", None),
            ("preempted_req_ids", set()),
            ("has_structured_output_requests", False),
            ("pending_structured_output_tokens", False),
            ("num_invalid_spec_tokens", None),
            ("kv_connector_metadata", Obj("MultiKVConnectorMetadata", [("metadata", (nixl, hisparse)), ("extra_async_saves", None)])),
            ("has_sync_kv_loads", False),
            ("aux_output_connector_metadata", None),
            ("ec_connector_metadata", None),
            ("ec_manager_metadata", None),
            ("new_block_ids_to_zero", None),
            ("kv_cache_block_copies", None),
            ("kv_connector_block_state", None),
            ("num_spec_tokens_to_schedule", 0),
            ("num_common_prefix_blocks", [0]),
        ],
    )


def scheduler_stats(d: DumpStep) -> Obj:
    """The step's ``SchedulerStats`` (vLLM 0.32's fields, in order)."""
    prefix = Obj(
        "PrefixCacheStats",
        [
            ("reset", False),
            ("requests", 0),
            ("queries", 0),
            ("hits", 0),
            ("preempted_requests", 0),
            ("preempted_queries", 0),
            ("preempted_hits", 0),
            ("hits_by_source", {}),
        ],
    )
    return Obj(
        "SchedulerStats",
        [
            ("num_running_reqs", len(d.req_ids)),
            ("num_waiting_reqs", d.waiting),
            ("num_skipped_waiting_reqs", 0),
            ("num_kv_fetch_reqs_by_stage", {}),
            ("step_counter", d.step),
            ("current_wave", 0),
            ("kv_cache_usage", d.kv_cache_usage),
            ("iteration_details", None),
            ("prefix_cache_stats", prefix),
            ("connector_prefix_cache_stats", None),
            ("kv_cache_eviction_events", []),
            ("spec_decoding_stats", None),
            ("kv_connector_stats", d.kv_connector_stats),
            ("ec_connector_stats", None),
            ("waiting_lora_adapters", {}),
            ("running_lora_adapters", {}),
            ("cudagraph_stats", None),
            ("perf_stats", None),
        ],
    )


def crash_dump(pid: int, ts: float, d: DumpStep, model: str, version: str) -> list[str]:
    """The engine core's lines when a step fails: vLLM's ``dump_engine_exception`` (the
    scheduler output as ``prepare_object_to_dump`` prints it, the stats as ``%s``), then the
    fatal error."""
    p = "EngineCore_DP0"
    return [
        line(p, pid, "ERROR", ts, "dump_input.py:72", f"Dumping input data for V1 LLM engine (v{version}) with config: model='{model}', ..."),
        line(p, pid, "ERROR", ts, "dump_input.py:79", f"Dumping scheduler output for model execution: {dump(scheduler_output(d))}"),
        line(p, pid, "ERROR", ts, "dump_input.py:81", f"Dumping scheduler stats: {py_repr(scheduler_stats(d))}"),
        line(p, pid, "ERROR", ts, "core.py:866", "EngineCore encountered a fatal error."),
        line(p, pid, "ERROR", ts, "core.py:866", "Traceback (most recent call last):"),
        line(
            p,
            pid,
            "ERROR",
            ts,
            "core.py:866",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 857, in run_engine_core',
        ),
        line(p, pid, "ERROR", ts, "core.py:866", "    engine_core.run_busy_loop()"),
        line(
            p,
            pid,
            "ERROR",
            ts,
            "core.py:866",
            "RuntimeError: Worker failed with error 'CUDA error: unspecified launch failure', please check the stack trace above for the root cause",
        ),
    ]


def api_server_death(pid: int, ts: float) -> list[str]:
    p = "APIServer"
    return [
        line(p, pid, "ERROR", ts, "async_llm.py:525", "AsyncLLM output_handler failed."),
        line(p, pid, "ERROR", ts, "async_llm.py:525", "Traceback (most recent call last):"),
        line(
            p,
            pid,
            "ERROR",
            ts,
            "async_llm.py:525",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 481, in output_handler',
        ),
        line(p, pid, "ERROR", ts, "async_llm.py:525", "    outputs = await engine_core.get_output_async()"),
        line(
            p,
            pid,
            "ERROR",
            ts,
            "async_llm.py:525",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ),
        line(p, pid, "INFO", ts, "launcher.py:110", "Shutting down FastAPI HTTP server."),
    ]


def kmsg_xid(seq: int, usec: int, bus: str, xid: int, pid: int, name: str = "python3") -> str:
    """A /dev/kmsg record, as in the shared H200 capture."""
    return f"4,{seq},{usec},c;NVRM: Xid (PCI:{bus}): {xid}, pid={pid}, name={name}, channel 0x0000000a"
