"""A ``stacks`` part built from the recorded py-spy dumps (tests/fixtures/stacks), for the tests
of what shows it: the API, the page, the export and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.model import GpuSample
from collector.stacks import gpus, part
from collector.stacks.finder import EngineProcess
from collector.stacks.pyspy import Dump, parse_dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def stacks_part(ts: float = 1_796_000_010.0, *, pid: int = 9682) -> dict[str, Any]:
    """An engine core blocked on a lock (its main thread in ``wait_for_the_engine_lock``), read
    twice, the second dump native, beside a worker py-spy could not read."""
    one = Dump(pid, ts, 0.04, threads=parse_dump((FIXTURES / "blocked-1.json").read_text()))
    two = Dump(pid, ts + 3.0, 0.25, threads=parse_dump((FIXTURES / "blocked-2-native.json").read_text()), native=True)
    core = EngineProcess(pid=pid, own_pid=7, ppid=pid - 1, role="engine_core", title="VLLM::EngineCore", uid=0)
    worker = EngineProcess(pid=pid + 1, own_pid=8, ppid=pid, role="worker", title="VLLM::Worker_TP0", uid=0)
    gone = Dump(pid + 1, ts, 0.01, cause="gone", error="Failed to get process executable name. Check that the process is running.")
    samples = [
        [GpuSample(gpu="GPU-0", index=0, ts=ts, name="NVIDIA H100", utilization=100.0, processes=[{"pid": pid + 1, "used_memory": 70 << 30}])],
        [GpuSample(gpu="GPU-0", index=0, ts=ts + 3.0, name="NVIDIA H100", utilization=100.0, processes=[{"pid": pid + 1, "used_memory": 70 << 30}])],
    ]
    return part.build(
        processes=[part.process_entry(core, one, two, None), part.process_entry(worker, gone, None, {"CUDA_VISIBLE_DEVICES": "0"})],
        reasons=[f"stacks not read: the process exited before py-spy read it [worker {pid + 1}]"],
        started_at=ts,
        finished_at=ts + 3.3,
        interval_s=3.0,
        tool={"name": "py-spy", "version": "0.4.3"},
        env={"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1"},
        gpus=gpus.view(samples, {pid: "engine_core", pid + 1: "worker"}),
        notes=["the engine's processes run in their own pid namespace: its pid 7 is 9682 here"],
    )
