"""A simulated NVML: the GPUs of the demo's simulated engines (``collector.sim.pair``) and of the
CPU tests. Scriptable: values per GPU, unsupported readings, a GPU lost after N polls, and Xid
events pushed by the caller. It implements ``collector.sources.nvml_backend.NvmlBackend``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from collector.sources.nvml_backend import XID_EVENT_TYPE, FieldNotSupported, GpuLost, NvmlEvent, NvmlUnavailable, RemappedRows


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str = "00000000:00:06.0"  # NVML's form
    name: str = "Fake GPU"
    values: dict[str, Any] = field(default_factory=dict)  # reading name -> value
    unsupported: set[str] = field(default_factory=set)  # reading names raising FieldNotSupported
    lost_after_polls: int | None = None  # every call raises GpuLost after this many polls
    lost: bool = False


_DEFAULTS: dict[str, Any] = {
    "memory": (1 << 30, 80 << 30),
    "utilization": (50.0, 20.0),
    "temperature": 40.0,
    "power_w": 120.0,
    "sm_clock_mhz": 1980.0,
    "clock_event_reasons": 0,
    "ecc_volatile": (0, 0),
    "remapped_rows": RemappedRows(0, 0, False, False),
    "pcie_replay": 0,
    "compute_processes": [],
}


class FakeNvmlBackend:
    """A scriptable NVML. ``calls`` counts every reading per (GPU index, name).

    A "poll" is counted by the ``memory`` reading, the first one NvmlSource takes.
    """

    def __init__(self, gpus: Iterable[FakeGpu] = (), *, available: bool = True, driver: str = "580.0") -> None:
        self.gpus = list(gpus)
        self.available = available
        self.driver = driver
        self.calls: dict[tuple[int, str], int] = {}
        self.initialised = False
        self.event_sets_open = 0
        self._events: queue.Queue[NvmlEvent] = queue.Queue()
        self.waiting = threading.Event()  # set while a thread sits in event_wait
        self._polls: dict[int, int] = {}

    def push_xid(self, index: int, xid: int) -> None:
        self._events.put(NvmlEvent(index=index, event_type=XID_EVENT_TYPE, data=xid))

    def init(self) -> None:
        if not self.available:
            raise NvmlUnavailable("NVML Shared Library Not Found (fake)")
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def driver_version(self) -> str:
        return self.driver

    def device_count(self) -> int:
        return len(self.gpus)

    def handle(self, index: int) -> int:
        self._check(index, "handle")
        return index

    def _check(self, index: int, name: str) -> FakeGpu:
        gpu = self.gpus[index]
        self.calls[(index, name)] = self.calls.get((index, name), 0) + 1
        # a poll starts with "memory": the GPU is lost from the start of poll N+1
        if name == "memory" and gpu.lost_after_polls is not None and self._polls.get(index, 0) >= gpu.lost_after_polls:
            gpu.lost = True
        if gpu.lost:
            raise GpuLost(f"GPU {index} is lost (fake)", 15)
        if name in gpu.unsupported:
            raise FieldNotSupported(f"{name} not supported (fake)", 3)
        return gpu

    def _read(self, h: int, name: str) -> Any:
        gpu = self._check(h, name)
        return gpu.values.get(name, _DEFAULTS.get(name))

    def uuid(self, h: int) -> str:
        return self._check(h, "uuid").uuid

    def name(self, h: int) -> str:
        return self._check(h, "name").name

    def bus_id(self, h: int) -> str:
        return self._check(h, "bus_id").bus_id

    def memory(self, h: int) -> tuple[int, int]:
        value = self._read(h, "memory")
        self._polls[h] = self._polls.get(h, 0) + 1
        return value

    def utilization(self, h: int) -> tuple[float, float]:
        return self._read(h, "utilization")

    def temperature(self, h: int) -> float:
        return self._read(h, "temperature")

    def power_w(self, h: int) -> float:
        return self._read(h, "power_w")

    def sm_clock_mhz(self, h: int) -> float:
        return self._read(h, "sm_clock_mhz")

    def clock_event_reasons(self, h: int) -> int:
        return self._read(h, "clock_event_reasons")

    def ecc_volatile(self, h: int) -> tuple[int, int]:
        return self._read(h, "ecc_volatile")

    def remapped_rows(self, h: int) -> RemappedRows:
        return self._read(h, "remapped_rows")

    def pcie_replay(self, h: int) -> int:
        return self._read(h, "pcie_replay")

    def compute_processes(self, h: int) -> list[tuple[int, int | None]]:
        return self._read(h, "compute_processes")

    def event_set_create(self) -> str:
        self.event_sets_open += 1
        return "event-set"

    def register_xid_events(self, event_set: Any, h: int) -> None:
        self._check(h, "register_xid_events")

    def event_wait(self, event_set: Any, timeout_ms: int) -> NvmlEvent | None:
        # Blocks the calling thread for up to timeout_ms, as nvmlEventSetWait does.
        self.waiting.set()
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def event_set_free(self, event_set: Any) -> None:
        self.event_sets_open -= 1
