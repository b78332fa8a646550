"""Run by the vLLM virtualenv's python (from test_version_gate.py): vLLM's version set outside the
recorder's range, the stat-logger plugin loaded the way vLLM loads it (its entry point) and the
scheduler built the way the engine core builds it (``--scheduler-cls``); then the same with
``FLIGHTREC_RECORDER_ANY_VLLM=1``. Prints what ran, what was written and what was logged, as one
JSON object. Not a test module itself."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

MARKER = "FLIGHTREC-RESULT "
work = Path(tempfile.mkdtemp(prefix="flightrec-gate-"))
os.environ["FLIGHTREC_RECORDER_DIR"] = str(work / "rec")
os.environ["FLIGHTREC_ENGINE_NAME"] = "gate"
version = sys.argv[1]

import torch  # noqa: E402
import vllm.version  # noqa: E402
from tiny_llama import tiny_llama  # noqa: E402 - beside this script (its folder is first on sys.path)
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories  # noqa: E402
from vllm.v1.metrics.stats import SchedulerStats  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

real_version = vllm.version.__version__
vllm.version.__version__ = version  # what collector.vllm._version reads first

messages: list[str] = []


class Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        messages.append(record.getMessage())


logging.getLogger("collector.recorder").addHandler(Capture())

model = tiny_llama(work / "model")
cfg = EngineArgs(
    model=str(model),
    load_format="dummy",
    skip_tokenizer_init=True,
    max_model_len=2048,
    dtype="bfloat16",
    block_size=16,
    enable_prefix_caching=False,
    scheduler_cls="collector.vllm.RecordingScheduler",
).create_engine_config()
cfg.cache_config.num_gpu_blocks = 256
kv = KVCacheConfig(
    num_blocks=256,
    kv_cache_tensors=[],
    kv_cache_groups=[
        KVCacheGroupSpec(
            ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
            FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16),
        )
    ],
)

plugins = [f for f in load_stat_logger_plugin_factories() if f.__module__ == "collector.vllm.plugin"]
plugin = plugins[0](cfg, 0)
plugin.log_engine_initialized()
plugin.record(SchedulerStats(num_running_reqs=1), None)
sched = cfg.scheduler_config.get_scheduler_cls()(
    vllm_config=cfg,
    kv_cache_config=kv,
    structured_output_manager=StructuredOutputManager(cfg),
    include_finished_set=False,
    log_stats=True,
    block_size=16,
    hash_block_size=16,
)
sched.add_request(Request("cmpl-gate-0-abcdef12", list(range(1, 33)), SamplingParams(max_tokens=2), None))
out = sched.schedule()
print(
    MARKER
    + json.dumps(
        {
            "real_version": real_version,
            "plugin_class": f"{type(plugin).__module__}.{type(plugin).__qualname__}",
            "plugin_records": plugin.channel is not None and plugin.channel.active,
            "scheduler_mro": [c.__name__ for c in type(sched).__mro__][:3],
            "scheduler_records": sched._flightrec is not None,
            "scheduled": dict(out.num_scheduled_tokens),
            "files": sorted(p.name for p in (work / "rec").glob("*.ring")),
            "messages": messages,
        }
    )
)
