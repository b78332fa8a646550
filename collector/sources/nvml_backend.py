"""What NvmlSource needs from NVML, as a small protocol, and the real backend (the simulated one
the demo and the tests use is ``collector.sim.nvml``).

Exceptions (our own; pynvml's are translated where they enter, in ``PynvmlBackend``)::

    SourceError
     ├── NvmlError                 an NVML call failed this time (retried next poll)
     │    ├── FieldNotSupported    this GPU cannot give this reading (skipped from now on)
     │    └── GpuLost              NVMLError_GpuIsLost: the GPU fell off the bus
     └── SourceUnsupported
          └── NvmlUnavailable      no NVML library or no driver on this machine
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

from collector.sources.base import SourceError, SourceUnsupported

T = TypeVar("T")

XID_EVENT_TYPE = 0x8  # nvmlEventTypeXidCriticalError


class NvmlError(SourceError):
    """An NVML call failed; ``code`` is NVML's return code when known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class FieldNotSupported(NvmlError):
    """This GPU does not support this reading (or we may not read it)."""


class GpuLost(NvmlError):
    """NVML says the GPU is lost (fell off the bus)."""


class NvmlUnavailable(SourceUnsupported):
    """No NVML library, or no NVIDIA driver, on this machine."""


@dataclass(frozen=True, slots=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class NvmlEvent:
    """One event from ``nvmlEventSetWait``: ``index`` of the GPU, type and data (the Xid)."""

    index: int | None
    event_type: int
    data: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class NvmlBackend(Protocol):
    """Readings take the handle that ``handle(index)`` returned; all may raise NvmlError."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def uuid(self, h: Any) -> str: ...
    def name(self, h: Any) -> str: ...
    def bus_id(self, h: Any) -> str: ...
    def memory(self, h: Any) -> tuple[int, int]: ...  # (used, total) bytes
    def utilization(self, h: Any) -> tuple[float, float]: ...  # (gpu %, memory %)
    def temperature(self, h: Any) -> float: ...
    def power_w(self, h: Any) -> float: ...
    def sm_clock_mhz(self, h: Any) -> float: ...
    def clock_event_reasons(self, h: Any) -> int: ...
    def ecc_volatile(self, h: Any) -> tuple[int, int]: ...  # (uncorrected, corrected)
    def remapped_rows(self, h: Any) -> RemappedRows: ...
    def pcie_replay(self, h: Any) -> int: ...
    def compute_processes(self, h: Any) -> list[tuple[int, int | None]]: ...  # (pid, bytes)
    def event_set_create(self) -> Any: ...
    def register_xid_events(self, event_set: Any, h: Any) -> None: ...
    def event_wait(self, event_set: Any, timeout_ms: int) -> NvmlEvent | None: ...  # None: timeout
    def event_set_free(self, event_set: Any) -> None: ...


# -- the real one ---------------------------------------------------------------------


class PynvmlBackend:
    """nvidia-ml-py (``import pynvml``), errors translated into the tree above.

    ``module`` is the pynvml module; tests pass a stand-in, production leaves it None.
    """

    def __init__(self, module: ModuleType | None = None) -> None:
        self._nv = module
        self._handles: list[Any] = []

    def _translate(self, exc: Exception, what: str) -> NvmlError | NvmlUnavailable:
        nv = self._nv
        code = getattr(exc, "value", None)

        def is_(name: str) -> bool:
            return code is not None and code == getattr(nv, name, object())

        text = f"{what}: {exc}"
        if is_("NVML_ERROR_GPU_IS_LOST"):
            return GpuLost(text, code)
        if is_("NVML_ERROR_NOT_SUPPORTED") or is_("NVML_ERROR_NO_PERMISSION") or is_("NVML_ERROR_FUNCTION_NOT_FOUND"):
            return FieldNotSupported(text, code)
        if is_("NVML_ERROR_LIBRARY_NOT_FOUND") or is_("NVML_ERROR_DRIVER_NOT_LOADED"):
            return NvmlUnavailable(text)
        return NvmlError(text, code)

    @property
    def _m(self) -> Any:
        if self._nv is None:
            raise NvmlError("NVML used before init()")
        return self._nv

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._m.NVMLError as exc:
            raise self._translate(exc, what) from exc

    def init(self) -> None:
        if self._nv is None:
            try:
                import pynvml
            except ImportError as exc:  # nvidia-ml-py not installed
                raise NvmlUnavailable(f"pynvml is not importable: {exc}") from exc
            self._nv = pynvml
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            # library or driver missing -> NvmlUnavailable; anything else is retried
            raise self._translate(exc, "nvmlInit") from exc
        except OSError as exc:  # a broken libnvidia-ml.so
            raise NvmlUnavailable(f"nvmlInit: {exc}") from exc

    def shutdown(self) -> None:
        if self._nv is not None:
            try:
                self._m.nvmlShutdown()
            except self._nv.NVMLError:
                pass  # nothing to do about it at shutdown

    def driver_version(self) -> str:
        return _text(self._call("driver version", self._m.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._call("device count", self._m.nvmlDeviceGetCount))

    def handle(self, index: int) -> Any:
        h = self._call("handle", self._m.nvmlDeviceGetHandleByIndex, index)
        while len(self._handles) <= index:
            self._handles.append(None)
        self._handles[index] = h
        return h

    def uuid(self, h: Any) -> str:
        return _text(self._call("uuid", self._m.nvmlDeviceGetUUID, h))

    def name(self, h: Any) -> str:
        return _text(self._call("name", self._m.nvmlDeviceGetName, h))

    def bus_id(self, h: Any) -> str:
        info = self._call("pci info", self._m.nvmlDeviceGetPciInfo, h)
        return _text(info.busId)

    def memory(self, h: Any) -> tuple[int, int]:
        m = self._call("memory", self._m.nvmlDeviceGetMemoryInfo, h)
        return int(m.used), int(m.total)

    def utilization(self, h: Any) -> tuple[float, float]:
        u = self._call("utilization", self._m.nvmlDeviceGetUtilizationRates, h)
        return float(u.gpu), float(u.memory)

    def temperature(self, h: Any) -> float:
        nv = self._m
        return float(self._call("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU))

    def power_w(self, h: Any) -> float:
        return self._call("power", self._m.nvmlDeviceGetPowerUsage, h) / 1000.0

    def sm_clock_mhz(self, h: Any) -> float:
        nv = self._m
        return float(self._call("sm clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM))

    def clock_event_reasons(self, h: Any) -> int:
        nv = self._m
        # renamed from "throttle reasons" in newer bindings; either name reads the same mask
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is None:
            fn = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call("clock event reasons", fn, h))

    def ecc_volatile(self, h: Any) -> tuple[int, int]:
        nv = self._m
        get = nv.nvmlDeviceGetTotalEccErrors
        unc = self._call("ecc", get, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        cor = self._call("ecc", get, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        return int(unc), int(cor)

    def remapped_rows(self, h: Any) -> RemappedRows:
        cor, unc, pending, failure = self._call("remapped rows", self._m.nvmlDeviceGetRemappedRows, h)
        return RemappedRows(int(cor), int(unc), bool(pending), bool(failure))

    def pcie_replay(self, h: Any) -> int:
        return int(self._call("pcie replay", self._m.nvmlDeviceGetPcieReplayCounter, h))

    def compute_processes(self, h: Any) -> list[tuple[int, int | None]]:
        procs = self._call("processes", self._m.nvmlDeviceGetComputeRunningProcesses, h)
        out: list[tuple[int, int | None]] = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            # NVML reports "not available" as a huge sentinel (or None in pynvml)
            out.append((int(p.pid), int(used) if used is not None and used < (1 << 62) else None))
        return out

    def event_set_create(self) -> Any:
        return self._call("event set", self._m.nvmlEventSetCreate)

    def register_xid_events(self, event_set: Any, h: Any) -> None:
        nv = self._m
        self._call("register events", nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, event_set)

    def event_wait(self, event_set: Any, timeout_ms: int) -> NvmlEvent | None:
        nv = self._m
        try:
            data = nv.nvmlEventSetWait_v2(event_set, timeout_ms)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_TIMEOUT", object()):
                return None
            raise self._translate(exc, "event wait") from exc
        return NvmlEvent(
            index=self._index_of(data.device),
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance_id=_opt_int(getattr(data, "gpuInstanceId", None)),
            compute_instance_id=_opt_int(getattr(data, "computeInstanceId", None)),
        )

    def event_set_free(self, event_set: Any) -> None:
        try:
            self._call("event set free", self._m.nvmlEventSetFree, event_set)
        except NvmlError:
            pass

    def _index_of(self, device: Any) -> int | None:
        import ctypes

        def addr(h: Any) -> int | None:
            try:
                return ctypes.cast(h, ctypes.c_void_p).value
            except (TypeError, ctypes.ArgumentError):
                return None

        target = addr(device)
        for i, h in enumerate(self._handles):
            if h is not None and target is not None and addr(h) == target:
                return i
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    v = int(value)
    return None if v == 0xFFFFFFFF else v  # NVML's "not MIG" marker
