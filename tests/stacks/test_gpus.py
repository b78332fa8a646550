"""The GPUs' readings at each dump, from the samples the sidecar holds."""

from __future__ import annotations

from collector.model import GpuSample
from collector.stacks import gpus


def _s(ts: float, util: float | None, index: int = 0, procs: list[dict[str, int]] | None = None) -> GpuSample:
    return GpuSample(gpu=f"GPU-{index}", index=index, ts=ts, name="NVIDIA H100", utilization=util, memory_used=70 << 30, processes=procs or [])


def test_a_gpu_busy_in_every_reading_is_named_as_a_kernel_or_a_collective() -> None:
    view = gpus.view(
        [[_s(1.0, 100.0, procs=[{"pid": 5002, "used_memory": 1 << 30}])], [_s(4.0, 99.0, procs=[{"pid": 5002, "used_memory": 1 << 30}])]],
        {5002: "worker"},
    )
    (g,) = view
    assert [r["utilization"] for r in g["readings"]] == [100.0, 99.0]
    assert g["processes"] == [{"pid": 5002, "used_memory": 1 << 30, "role": "worker"}]
    assert g["hint"] is not None and "collective" in g["hint"]


def test_idle_unknown_and_missing_readings() -> None:
    idle = gpus.view([[_s(1.0, 0.0)], [_s(4.0, 1.0)]], {})
    assert "waits on the host" in (idle[0]["hint"] or "")
    unknown = gpus.view([[_s(1.0, None)], [_s(4.0, None)]], {})
    assert unknown[0]["hint"] is None  # unknown is not idle
    missing = gpus.view([[_s(1.0, 100.0, index=0)], [_s(4.0, 100.0, index=0), _s(4.0, 100.0, index=1)]], {})
    assert [g["index"] for g in missing] == [0, 1]
    assert missing[1]["readings"][0] is None and missing[1]["hint"] is None
