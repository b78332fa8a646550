"""What NVML said of the engine's GPUs when its stacks were read (pure, over the samples the
sidecar already holds: no second NVML client).

At each dump, the newest sample of each GPU: utilisation, memory, power, SM clock, temperature,
and its compute processes named by the engine's roles (a worker's pid on the GPU is the worker).
A GPU busy in both readings while no step ends is a kernel that does not finish or a collective
waiting for a peer (both read as 100%: NVML cannot tell them apart, the stacks can); one idle in
both is an engine waiting on the host (Python, a lock, the network).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collector.model import GpuSample

FIELDS = ("utilization", "memory_utilization", "memory_used", "memory_total", "power_w", "sm_clock_mhz", "temperature", "clock_event_reasons")
BUSY = 90.0  # percent: a GPU this busy in every reading is held by a kernel
IDLE = 5.0


def reading(s: GpuSample) -> dict[str, Any]:
    return {"ts": s.ts, **{k: getattr(s, k) for k in FIELDS}}


def view(readings: Sequence[Sequence[GpuSample]], roles: Mapping[int, str]) -> list[dict[str, Any]]:
    """One entry per GPU: its readings at each dump (null where that GPU had no sample then),
    its processes (the newest reading's) with the engine's role of each, and a hint."""
    by_gpu: dict[str, list[GpuSample | None]] = {}
    for i, samples in enumerate(readings):
        for s in samples:
            slots = by_gpu.setdefault(s.gpu, [None] * len(readings))
            slots[i] = s
    out = []
    for gpu, slots in by_gpu.items():
        newest = next(s for s in reversed(slots) if s is not None)
        utils = [s.utilization for s in slots if s is not None and s.utilization is not None]
        out.append(
            {
                "gpu": gpu,
                "index": newest.index,
                "name": newest.name,
                "bus_id": newest.bus_id,
                "readings": [reading(s) if s is not None else None for s in slots],
                "processes": [
                    {"pid": p.get("pid"), "used_memory": p.get("used_memory"), "role": roles.get(p["pid"]) if isinstance(p.get("pid"), int) else None}
                    for p in newest.processes
                    if isinstance(p, dict)
                ],
                "hint": hint(utils, len(slots)),
            }
        )
    out.sort(key=lambda g: (g["index"], g["gpu"]))
    return out


def hint(utils: Sequence[float], readings: int) -> str | None:
    if not utils or len(utils) < readings:
        return None
    if min(utils) >= BUSY:
        return "busy in every reading with no step ending: a kernel that does not finish, or a collective (NCCL) waiting for a peer"
    if max(utils) <= IDLE:
        return "idle in every reading: the engine waits on the host (Python, a lock, the network), not on this GPU"
    return None
