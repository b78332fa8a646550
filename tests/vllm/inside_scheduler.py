"""Run by the vLLM virtualenv's python (from test_scheduler_real.py): builds vLLM's real
scheduler the way its engine core does (``scheduler_config.get_scheduler_cls()`` with
``--scheduler-cls collector.vllm.RecordingScheduler``), with async scheduling on and off, drives
real requests through schedule / update_from_output in the engine core's async order, and
prints what the recorder wrote as one JSON object. Not a test module itself."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

MARKER = "FLIGHTREC-RESULT "
work = Path(tempfile.mkdtemp(prefix="flightrec-sched-"))
os.environ["FLIGHTREC_RECORDER_DIR"] = str(work / "rec")

import torch  # noqa: E402
from tiny_llama import tiny_llama  # noqa: E402 - beside this script (its folder is first on sys.path)
from vllm.compilation.cuda_graph import CUDAGraphStat  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from collector.channel.blocks import RequestRecords  # noqa: E402
from collector.channel.codec import decode  # noqa: E402
from collector.channel.ringfile import RingReader  # noqa: E402
from collector.model import Fingerprint, StepRecord, WorkloadArrival, WorkloadBatch  # noqa: E402
from collector.vllm.plugin import FlightRecorderStatLogger  # noqa: E402

BLOCK = 16
model = tiny_llama(work / "model")


def build(async_scheduling: bool, tag: str, prefix_caching: bool = False) -> Any:
    os.environ["FLIGHTREC_ENGINE_NAME"] = tag
    cfg = EngineArgs(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=2048,
        dtype="bfloat16",
        block_size=BLOCK,
        enable_prefix_caching=prefix_caching,
        scheduler_cls="collector.vllm.RecordingScheduler",
    ).create_engine_config()
    # The CPU platform hook turns async scheduling off; on a GPU vLLM leaves it on by default.
    cfg.scheduler_config.async_scheduling = async_scheduling
    cfg.cache_config.num_gpu_blocks = 256  # what the engine core sets once it has sized the KV cache
    kv = KVCacheConfig(
        num_blocks=256,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16),
            )
        ],
    )
    cls = cfg.scheduler_config.get_scheduler_cls()  # what EngineCore does (vllm/v1/engine/core.py)
    sched = cls(
        vllm_config=cfg,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(cfg),
        include_finished_set=False,
        log_stats=True,
        block_size=BLOCK,
        hash_block_size=BLOCK,
    )
    return cfg, cls, sched


def output_for(so: Any, token: int) -> ModelRunnerOutput:
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[token] for _ in ids],
        cudagraph_stats=CUDAGraphStat(len(ids), 8, 8 - len(ids), "FULL"),
    )


ROW_COLUMNS = ("request_id", "prompt_len", "computed_tokens", "output_tokens", "status")


def block_rows(o: StepRecord) -> list[list[Any]]:
    """The rows of a scheduler's step as lists of ``ROW_COLUMNS``, decoded from its block."""
    b = o.request_block
    return [] if b is None else [list(r) for r in zip(*(b.column(c) for c in ROW_COLUMNS), strict=True)]


def ring(tag: str, role: str) -> list[Any]:
    out = []
    for path in sorted((work / "rec").glob(f"{tag}.{role}.*.ring")):
        requests = RequestRecords()
        for p in RingReader(path).read():
            o = decode(p, engine=tag, requests=requests)[1]
            if o is not None:
                out.append(o)
    return out


def drive(async_scheduling: bool) -> dict[str, Any]:
    tag = "async" if async_scheduling else "sync"
    cfg, cls, sched = build(async_scheduling, tag)
    plugin = FlightRecorderStatLogger(cfg, 0)
    for i, n in enumerate((40, 70)):
        sched.add_request(
            Request(f"cmpl-{tag}{i}-0-abcdef12", list(range(1, n + 1)), SamplingParams(max_tokens=3, ignore_eos=True), None, arrival_time=1000.0 + i)
        )
    placeholders: list[int] = []
    stamps: list[int] = []
    order: list[str] = []

    def process(done: Any) -> None:
        order.append(f"update{steps[id(done)]}")
        for eco in sched.update_from_output(done, output_for(done, 7)).values():
            if eco.scheduler_stats is not None:
                stamps.append(eco.scheduler_stats.step_counter)
                plugin.record(eco.scheduler_stats, None)

    steps: dict[int, int] = {}
    pending: list[Any] = []
    for step in range(1, 6):
        so = sched.schedule()
        steps[id(so)] = step
        order.append(f"schedule{step}")
        # AsyncScheduler's own bookkeeping ran: output placeholders for the tokens in flight
        placeholders.append(max((r.num_output_placeholders for r in sched.running), default=0))
        pending.append(so)
        # async: vLLM's engine core processes step n's output after scheduling step n+1
        if async_scheduling and len(pending) < 2:
            continue
        process(pending.pop(0))
    while pending:
        process(pending.pop(0))
    rows = [o for o in ring(tag, "sched") if isinstance(o, StepRecord)]
    stats = [o for o in ring(tag, "stats") if isinstance(o, StepRecord)]
    fps = [o for o in ring(tag, "sched") if isinstance(o, Fingerprint)]
    wl = workload(tag)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "instance_mro": [c.__name__ for c in type(sched).__mro__],
        "is_async": isinstance(sched, AsyncScheduler),
        "placeholders": placeholders,
        "stamps": stamps,
        "rows": [{"step": o.step, "reqs": block_rows(o)} for o in rows],
        "stats_steps": [o.step for o in stats],
        "order": order,
        "stats_raw_extras": _stats_extras(tag),
        "scheduler_base": fps[0].facts.get("scheduler_base") if fps else None,
        "async_fact": fps[0].facts.get("async_scheduling") if fps else None,
        "workload": wl,
    }


def workload(tag: str) -> list[dict[str, Any]]:
    """The ring's workload records, each as a dict with its event ("arrive" or "end") and id."""
    return [
        {"ev": "arrive" if isinstance(w, WorkloadArrival) else "end", "id": w.request_id, **w._asdict()}
        for o in ring(tag, "sched")
        if isinstance(o, WorkloadBatch)
        for w in o.records
    ]


def _stats_extras(tag: str) -> list[Any]:
    from collector.channel.codec import STEP_HEAD

    out = []
    for path in sorted((work / "rec").glob(f"{tag}.stats.*.ring")):
        for p in RingReader(path).read():
            if p[:1] == b"S" and len(p) > 1 + STEP_HEAD.size:
                out.append(json.loads(p[1 + STEP_HEAD.size :]))
    return out


def drive_prefix() -> list[Any]:
    """Prefix caching on: a second request sharing the first one's first 48 tokens (3 blocks),
    sent once the first has run, finds them cached; a third shares nothing."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    tag = "prefix"
    cfg, _, sched = build(False, tag, prefix_caching=True)
    hash_fn = get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)  # as EngineCore sets it up
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK, hash_fn)
    shared = list(range(1, 49))
    prompts = (shared + list(range(100, 116)), shared + list(range(200, 216)), list(range(300, 364)))
    for i, prompt in enumerate(prompts):
        sched.add_request(
            Request(
                f"cmpl-{tag}{i}-0-abcdef12", prompt, SamplingParams(max_tokens=2, ignore_eos=True), None, arrival_time=2000.0 + i, block_hasher=hasher
            )
        )
        for _ in range(3):  # prefill and two tokens: the request ends, its blocks stay cached
            so = sched.schedule()
            if so.num_scheduled_tokens:
                sched.update_from_output(so, output_for(so, 7))
    return [w for w in workload(tag) if w["ev"] == "end"]


result = {"async": drive(True), "sync": drive(False), "prefix_ends": drive_prefix()}
print(MARKER + json.dumps(result, default=str))
