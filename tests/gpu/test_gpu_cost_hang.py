"""The pure parts of the GPU cost and hang phases (scripts/gpu/vllm_gpu_cost_hang.py): model
shapes and memory by GPU, the capacity loop's concurrency, the reading of py-spy dumps, hang
snapshots and pages, and the JSON writer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import vllm_gpu_cost_hang as ch  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 00000000:00:06.0"
H200 = "NVIDIA H200, 580.159.04, 143771 MiB, 00000000:00:06.0"


def test_shapes_have_their_published_sizes() -> None:
    assert ch.params(ch.SHAPES["1b"]) / 1e9 == pytest.approx(1.1, abs=0.05)  # TinyLlama 1.1B
    assert ch.params(ch.SHAPES["8b"]) / 1e9 == pytest.approx(8.03, abs=0.01)  # Llama 3 8B
    assert ch.params(ch.SHAPES["14b"]) / 1e9 == pytest.approx(14.5, abs=0.3)
    assert ch.kv_bytes_per_token(ch.SHAPES["8b"]) == 2 * 32 * 8 * 128 * 2  # 128 KiB a token


def test_gpu_memory_is_read_from_nvidia_smi() -> None:
    assert ch.gpu_total_gib(H100) == pytest.approx(79.65, abs=0.01)
    assert ch.gpu_total_gib("FileNotFoundError(2, 'No such file')") is None


def test_auto_picks_by_gpu_memory_and_leaves_room_for_two() -> None:
    h100 = ch.plan_memory("auto", ch.gpu_total_gib(H100), smoke=False)
    h200 = ch.plan_memory("auto", ch.gpu_total_gib(H200), smoke=False)
    assert h100["shape"] == "8b" and h200["shape"] == "14b"
    for plan, line in ((h100, H100), (h200, H200)):
        total = (ch.gpu_total_gib(line) or 0) * 1024**3
        per_server = plan["weights_gib"] * 1024**3 + plan["kv_bytes"] + 6 * 1024**3
        assert per_server <= plan["gpu_util"] * total + 0.01 * 1024**3  # weights_gib is rounded
        assert 2 * plan["gpu_util"] <= 0.92
        assert plan["kv_bytes"] >= 10 * 1024**3
        assert "auto" in plan["why"]


def test_a_shape_too_big_for_its_share_is_refused() -> None:
    with pytest.raises(RuntimeError, match="too little"):
        ch.plan_memory("14b", ch.gpu_total_gib(H100), smoke=False)
    with pytest.raises(RuntimeError, match="memory"):
        ch.plan_memory("auto", None, smoke=False)


def test_the_earlier_runs_memory_for_1b_and_a_tiny_model_for_smoke() -> None:
    assert ch.plan_memory("1b", None, smoke=False)["kv_bytes"] == 16 * 1024**3
    assert ch.plan_memory("8b", None, smoke=True)["shape"] == "tiny"


def test_capacity_concurrency_is_what_the_cache_holds() -> None:
    cfg = ch.SHAPES["8b"]
    kv = 14 * 1024**3
    c = ch.capacity_concurrency(kv, cfg, 512, 128)
    assert c == int(0.9 * kv // ch.kv_bytes_per_token(cfg) / 640)
    assert ch.capacity_concurrency(16 * 1024**3, ch.SHAPES["1b"], 512, 128) == 256  # capped


DUMP = """Process 4242: VLLM::EngineCore
Python v3.12.3 (/usr/bin/python3.12)

Thread 4242 (active): "MainThread"
    synchronize (torch/cuda/streams.py:231)
    get_output (vllm/v1/worker/gpu/async_utils.py:174)
    step_with_batch_queue (vllm/v1/engine/core.py:430)
    run_busy_loop (vllm/v1/engine/core.py:960)
Thread 4300 (idle): "EngineCoreOutputThread"
    wait (threading.py:355)
"""


def test_main_thread_frames_from_a_py_spy_dump() -> None:
    top = ch.main_thread(DUMP)
    assert top is not None and top[0] == "synchronize (torch/cuda/streams.py:231)" and len(top) == 4
    assert ch.main_thread("") is None and ch.main_thread("Process 1: x\n") is None


def _stacks(function: str) -> dict[str, object]:
    """A ``stacks`` part as the snapshot's capture writes it (flightrec.stacks/v1)."""
    sync = {"function": function, "file": "torch/cuda/streams.py", "line": 231}
    return {
        "schema": "flightrec.stacks/v1",
        "status": "captured",
        "processes": [
            {
                "pid": 4242,
                "role": "engine_core",
                "title": "VLLM::EngineCore",
                "state": "stuck",
                "blocking": {"tid": 4242, "thread": "MainThread", "state": "stuck", "frame": sync},
                "threads": [{"tid": 4242, "name": "MainThread", "frames": [sync, {"function": "run_busy_loop", "file": "vllm/v1/engine/core.py"}]}],
            },
            {"pid": 4100, "role": "api_server", "title": "VLLM::APIServer", "blocking": None, "threads": [{"frames": [{"function": "synchronize"}]}]},
        ],
        "gpus": [{"index": 0, "readings": [{"ts": 21.0, "utilization": 100}, None]}],
    }


def test_snapshot_hang_view_finds_the_engine_core_blocked_in_a_sync_and_the_busy_gpu() -> None:
    doc = {"stacks": _stacks("synchronize"), "gpu_samples": [{"ts": 10.0, "utilization": 0}, {"ts": 21.0, "utilization": 100}]}
    v = ch.snapshot_hang_view(doc, since=20.0)
    assert v["has_stacks"] and v["stacks_status"] == "captured" and v["engine_core_found"]
    assert v["engine_core_in_sync"] and v["engine_core_state"] == "stuck"
    assert v["engine_core_blocking_frame"]["function"] == "synchronize"
    assert v["nvml_busy"] and v["nvml_util_in_stacks"] == [100] and v["nvml_util_in_samples_after_launch"] == [100]


def test_snapshot_hang_view_goes_by_the_engine_cores_blocking_frame_not_another_process() -> None:
    doc = {"stacks": _stacks("wait"), "gpu_samples": []}  # the API server's sync frame does not count
    v = ch.snapshot_hang_view(doc, since=20.0)
    assert v["engine_core_found"] and not v["engine_core_in_sync"]
    reading = {"stacks": {"schema": "flightrec.stacks/v1", "status": "reading", "processes": []}, "gpu_samples": [{"ts": 30.0, "utilization": 97}]}
    r = ch.snapshot_hang_view(reading, since=20.0)
    assert r["stacks_status"] == "reading" and not r["engine_core_found"] and r["nvml_busy"]
    empty = ch.snapshot_hang_view({"gpu_samples": []}, since=0.0)
    assert not empty["has_stacks"] and not empty["nvml_busy"] and not empty["engine_core_in_sync"]


class FakeReceiver:
    def __init__(self, alerts: list[tuple[float, dict[str, object]]]) -> None:
        self._alerts = alerts

    def alerts(self) -> list[tuple[float, dict[str, object]]]:
        return self._alerts


def test_pages_match_the_wedge_by_name_or_by_the_snapshots_link() -> None:
    recv = FakeReceiver(
        [
            (5.0, {"labels": {"alertname": "VllmEngineWedged"}}),  # before: an earlier hang
            (12.0, {"labels": {"alertname": "VllmXid"}, "annotations": {"snapshot": "http://x/snapshots/9"}}),
            (13.0, {"labels": {"alertname": "VllmXid"}, "annotations": {"snapshot": "http://x/snapshots/7"}}),
            (14.0, {"labels": {"alertname": "VllmEngineWedged"}}),
        ]
    )
    got = ch.pages(recv, since=10.0, snapshot_id=7)  # type: ignore[arg-type]
    assert [ts for ts, _ in got] == [13.0, 14.0]
    assert [ts for ts, _ in ch.pages(recv, since=10.0, snapshot_id=None)] == [14.0]  # type: ignore[arg-type]


def test_dumps_keeps_number_lists_on_one_line_and_round_trips() -> None:
    body = {"ttft_ms": [1.5, None, 3e-05, -2], "nested": {"rows": [[1, 2], [3]]}, "names": ["a", "b"], "empty": []}
    text = ch.dumps(body)
    assert json.loads(text) == body
    assert '"ttft_ms": [1.5, null, 3e-05, -2]' in text
    assert '"a",' in text  # strings keep a line each


def test_level_metrics_above_capacity_decide_by_throughput_only() -> None:
    assert ch.level_metrics(0.95) == ("tok_s", "ttft_p99_ms", "itl_p99_ms")
    assert ch.level_metrics(1.2) == ("tok_s",)
