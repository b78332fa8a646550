"""Run by the vLLM virtualenv's python (from test_inside_vllm.py): drives the recorder with vLLM's
real classes and prints what came out as one JSON object. Not a test module itself."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

MARKER = "FLIGHTREC-RESULT "
work = Path(tempfile.mkdtemp(prefix="flightrec-inside-"))
os.environ["FLIGHTREC_RECORDER_DIR"] = str(work / "rec")
os.environ["FLIGHTREC_ENGINE_NAME"] = "inside"
os.environ["FLIGHTREC_POD_UID"] = "7f3c2b1a-9d4e-4c5f-8a6b-0e1d2c3b4a59"  # the downward API's metadata.uid
os.environ["NCCL_NET_PLUGIN"] = "libnccl-net-test.so"
os.environ["VLLM_API_KEY"] = "s3cret"

from tiny_llama import tiny_llama  # noqa: E402 - beside this script (its folder is first on sys.path)
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from collector.channel.blocks import RequestRecords  # noqa: E402
from collector.channel.codec import decode  # noqa: E402
from collector.channel.ringfile import RingReader  # noqa: E402
from collector.model import Fingerprint, StepRecord  # noqa: E402
from collector.vllm.plugin import FlightRecorderStatLogger  # noqa: E402
from collector.vllm.scheduler import _SchedRecorder  # noqa: E402

model = tiny_llama(work / "model")
kvt = KVTransferConfig(
    kv_connector="MultiConnector",
    kv_role="kv_both",
    kv_connector_extra_config={
        "connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
            {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes_to_use": 137438953472}},
        ]
    },
)
cfg = EngineArgs(
    model=str(model), load_format="dummy", skip_tokenizer_init=True, max_model_len=2048, dtype="bfloat16", block_size=64
).create_engine_config()
cfg.kv_transfer_config = kvt  # set after validation: its connectors need a GPU to be created


ROW_COLUMNS = ("request_id", "prompt_len", "computed_tokens", "output_tokens", "status")


def block_rows(o: StepRecord) -> list[list[Any]]:
    """The rows of a scheduler's step as lists of ``ROW_COLUMNS``, decoded from its block."""
    b = o.request_block
    return [] if b is None else [list(r) for r in zip(*(b.column(c) for c in ROW_COLUMNS), strict=True)]


def ring_records(role: str) -> list[object]:
    out = []
    for path in (work / "rec").glob(f"*.{role}.*.ring"):
        requests = RequestRecords()
        out.extend(decode(p, engine="inside", requests=requests) for p in RingReader(path).read())
    return out


result: dict[str, object] = {}

# 1. the stat logger on real SchedulerStats/IterationStats
plugin = FlightRecorderStatLogger(cfg, 0)
plugin.log_engine_initialized()
s = SchedulerStats(
    num_running_reqs=5,
    num_waiting_reqs=3,
    num_skipped_waiting_reqs=1,
    kv_cache_usage=0.032,
    step_counter=41,
    prefix_cache_stats=PrefixCacheStats(requests=2, queries=640, hits=128),
    kv_connector_stats={"NixlConnector": {"num_failed_transfers": [1], "transfer_duration": [0.1, 0.2]}},
)
it = IterationStats()
it.num_generation_tokens = 5
it.num_preempted_reqs = 2
it.finished_requests.append(
    FinishedRequestStats(FinishReason.LENGTH, request_id="cmpl-x-0", e2e_latency=2.5, num_prompt_tokens=300, num_generation_tokens=64)
)
plugin.record(s, it, engine_idx=0)
plugin.record(None, it, engine_idx=0)  # iteration stats alone ride on the next step
plugin.record(SchedulerStats(num_running_reqs=4), None, engine_idx=0)  # step_counter 0: counted
steps = [o for m, o in ring_records("stats") if isinstance(o, StepRecord)]
fps = [o for m, o in ring_records("stats") if isinstance(o, Fingerprint)]
result["steps"] = [o.to_dict() for o in steps]
result["fingerprint"] = fps[0].facts if fps else None

# 2. a fault in the recorder disables it, says so once, and never reaches vLLM


class Broken(SchedulerStats):
    @property
    def kv_cache_usage(self) -> float:  # type: ignore[override]
        raise RuntimeError("field moved")

    @kv_cache_usage.setter
    def kv_cache_usage(self, v: float) -> None:
        pass


messages: list[str] = []


class Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        messages.append(record.getMessage())


logging.getLogger("collector.recorder").addHandler(Capture())
broken = FlightRecorderStatLogger(cfg, 1)
raised = None
try:
    broken.record(Broken(num_running_reqs=1), None)
    broken.record(Broken(num_running_reqs=1), None)
    broken.record(SchedulerStats(num_running_reqs=2), None)
except Exception as exc:  # noqa: BLE001
    raised = repr(exc)
result["fault"] = {"raised": raised, "failed": broken.channel.failed, "messages": messages}

# 3. the scheduler side: per-request rows and step numbers that the stats carry
sched = _SchedRecorder(cfg)
reqs = []
for i in range(3):
    r = Request(f"cmpl-r{i}-0-abcdef12", list(range(100 + i)), SamplingParams(max_tokens=10), None)
    r.status = RequestStatus.RUNNING
    r.num_computed_tokens = 100 + i
    reqs.append(r)
out1, out2 = object(), object()
sched.scheduled(reqs, out1)  # step 1
for r in reqs:
    r.num_computed_tokens += 1
    r.append_output_token_ids(9)
sched.scheduled(reqs, out2)  # step 2 scheduled before step 1's output is processed (async)
sched.updating(out1)
st1 = SchedulerStats()
sched.stamp(st1)
sched.updating(out2)
st2 = SchedulerStats()
sched.stamp(st2)
req_steps = [o for m, o in ring_records("sched") if isinstance(o, StepRecord)]
result["sched"] = {
    "stamps": [st1.step_counter, st2.step_counter],
    "steps": [{"step": o.step, "rows": block_rows(o)} for o in req_steps],
}
result["files"] = sorted(p.name for p in (work / "rec").glob("*.ring"))
print(MARKER + json.dumps(result, default=str))  # vLLM logs to stdout too
