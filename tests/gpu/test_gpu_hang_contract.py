"""Reading what the hang detector and the stack capture expose (scripts/gpu/hang_contract.py):
the engine core's stack and NVML in a hang snapshot, the pages that are the wedge's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import hang_contract as ch  # noqa: E402


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
