"""The NVML source over the fake backend, and the real backend on a machine without NVML."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from typing import Any

import pytest

from collector.model import Event, EventKind, GpuSample, Severity
from collector.sim.nvml import FakeGpu, FakeNvmlBackend
from collector.sources.base import SourceError, SourceUnsupported
from collector.sources.nvml import NvmlSource, nvml_source_from_setting
from collector.sources.nvml_backend import (
    FieldNotSupported,
    GpuLost,
    NvmlError,
    NvmlUnavailable,
    PynvmlBackend,
    RemappedRows,
)
from collector.sources.nvml_settings import NvmlSettings

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def two_gpus(**kw: Any) -> FakeNvmlBackend:
    return FakeNvmlBackend(
        [
            FakeGpu(UUID0, bus_id="00000000:00:06.0", **kw),
            FakeGpu("GPU-1", bus_id="00000000:3B:00.0"),
        ]
    )


def started(backend: FakeNvmlBackend, **kw: Any) -> NvmlSource:
    src = NvmlSource(backend, **kw)
    src.start()
    return src


def test_sample_fields_and_canonical_bus_ids() -> None:
    backend = FakeNvmlBackend(
        [
            FakeGpu(
                UUID0,
                values={
                    "memory": (3 << 30, 141 << 30),
                    "utilization": (97.0, 40.0),
                    "temperature": 61.0,
                    "power_w": 412.5,
                    "sm_clock_mhz": 1980.0,
                    "clock_event_reasons": 0x4,
                    "ecc_volatile": (2, 7),
                    "remapped_rows": RemappedRows(1, 0, True, False),
                    "pcie_replay": 3,
                    "compute_processes": [(415, 2 << 30), (416, None)],
                },
            )
        ]
    )
    src = started(backend, clock=Clock(1234.0))
    (s,) = src.poll_once()
    assert isinstance(s, GpuSample)
    assert (s.gpu, s.index, s.bus_id, s.ts) == (UUID0, 0, "0000:00:06.0", 1234.0)
    assert (s.memory_used, s.memory_total, s.utilization, s.memory_utilization) == (3 << 30, 141 << 30, 97.0, 40.0)
    assert (s.temperature, s.power_w, s.sm_clock_mhz, s.clock_event_reasons) == (61.0, 412.5, 1980.0, 4)
    assert (s.ecc_volatile_uncorrected, s.ecc_volatile_corrected) == (2, 7)
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable, s.remapped_rows_pending) == (1, 0, True)
    assert s.pcie_replay == 3
    assert s.processes == [{"pid": 415, "used_memory": 2 << 30}, {"pid": 416, "used_memory": None}]


def test_unsupported_field_is_asked_once_then_skipped() -> None:
    backend = two_gpus(unsupported={"ecc_volatile", "remapped_rows"})
    src = started(backend)
    for _ in range(5):
        samples = src.poll_once()
    assert backend.calls[(0, "ecc_volatile")] == 1
    assert backend.calls[(0, "remapped_rows")] == 1
    assert backend.calls[(1, "ecc_volatile")] == 5  # remembered per GPU
    s0 = samples[0]
    assert isinstance(s0, GpuSample) and s0.ecc_volatile_uncorrected is None and s0.memory_used is not None
    assert src.gpus[0].unsupported == {"ecc_volatile", "remapped_rows"}


def test_pcie_replay_is_read_less_often() -> None:
    clock = Clock()
    backend = two_gpus(values={"pcie_replay": 9})
    src = started(backend, clock=clock, pcie_interval=30.0)
    for _ in range(10):
        samples = src.poll_once()
        clock.t += 1.0
    assert backend.calls[(0, "pcie_replay")] == 1
    assert backend.calls[(0, "memory")] == 10
    assert isinstance(samples[0], GpuSample) and samples[0].pcie_replay == 9  # carried forward
    clock.t += 30.0
    src.poll_once()
    assert backend.calls[(0, "pcie_replay")] == 2


def test_gpu_lost_is_one_event_then_slow_retry() -> None:
    clock = Clock()
    backend = two_gpus(lost_after_polls=2)
    src = started(backend, clock=clock, lost_retry_interval=30.0)
    kinds = []
    for _ in range(6):
        kinds.append([type(o).__name__ if isinstance(o, GpuSample) else o.kind.value for o in src.poll_once()])
        clock.t += 1.0
    assert kinds[:2] == [["GpuSample", "GpuSample"]] * 2
    assert kinds[2] == ["gpu_lost", "GpuSample"]
    assert kinds[3:] == [["GpuSample"]] * 3  # lost GPU skipped, the other one still sampled
    lost_calls = backend.calls[(0, "memory")]
    clock.t += 30.0
    out = src.poll_once()  # retried once after the interval: still lost, no second event
    assert backend.calls[(0, "handle")] >= 2
    assert [o for o in out if isinstance(o, Event)] == []
    assert backend.calls[(0, "memory")] == lost_calls


def test_gpu_lost_event_fields() -> None:
    backend = two_gpus(lost_after_polls=0)
    src = started(backend)
    ev = src.poll_once()[0]
    assert isinstance(ev, Event)
    assert (ev.kind, ev.severity, ev.source, ev.gpu) == (EventKind.GPU_LOST, Severity.CRITICAL, "nvml", "0000:00:06.0")


def test_lost_gpu_that_comes_back_is_sampled_again() -> None:
    clock = Clock()
    backend = two_gpus(lost_after_polls=1)
    src = started(backend, clock=clock, lost_retry_interval=5.0)
    src.poll_once()
    assert isinstance(src.poll_once()[0], Event)
    backend.gpus[0].lost = False
    backend.gpus[0].lost_after_polls = None
    clock.t += 6.0
    assert isinstance(src.poll_once()[0], GpuSample)


def test_other_nvml_errors_skip_only_this_round() -> None:
    class Flaky(FakeNvmlBackend):
        fail = True

        def temperature(self, h: int) -> float:
            if self.fail:
                self.fail = False
                raise NvmlError("unknown error", 999)
            return super().temperature(h)

    backend = Flaky([FakeGpu(UUID0)])
    src = started(backend)
    first, second = src.poll_once()[0], src.poll_once()[0]
    assert isinstance(first, GpuSample) and first.temperature is None
    assert isinstance(second, GpuSample) and second.temperature == 40.0
    assert src.errors == 1


def test_timings_are_kept_per_call() -> None:
    src = started(two_gpus())
    src.poll_once()
    assert src.timings["memory"].count == 2
    assert "pcie_replay" in src.timings


# -- the Xid event thread -----------------------------------------------------------------


def test_xid_events_arrive_without_blocking_the_loop() -> None:
    backend = two_gpus()
    src = NvmlSource(backend, interval=0.05, event_timeout_ms=200)
    got: list[Event] = []
    ticks = 0

    class Sink:
        def emit(self, item: object) -> None:
            if isinstance(item, Event):
                got.append(item)

    async def main() -> None:
        nonlocal ticks
        task = asyncio.create_task(src.run(Sink()))
        await asyncio.to_thread(backend.waiting.wait, 2.0)  # the thread sits in event_wait...
        t_end = time.monotonic() + 0.3
        while time.monotonic() < t_end:  # ...and the loop keeps turning meanwhile
            await asyncio.sleep(0.01)
            ticks += 1
        backend.push_xid(1, 43)
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert ticks >= 15  # 10 ms sleeps over 300 ms: the loop was never held by the 200 ms waits
    (ev,) = got
    assert (ev.kind, ev.xid, ev.source, ev.gpu) == (EventKind.XID, 43, "nvml", "0000:3b:00.0")
    assert ev.data["uuid"] == "GPU-1" and ev.data["catalog"]["name"]
    assert backend.event_sets_open == 0 and not backend.initialised  # freed and shut down on cancel


def test_xid_79_event_is_gpu_lost() -> None:
    from collector.sources.nvml_backend import NvmlEvent

    src = started(two_gpus())
    ev = src.xid_event(NvmlEvent(index=0, event_type=8, data=79), 1.0)
    assert ev.kind is EventKind.GPU_LOST and ev.severity is Severity.CRITICAL


# -- unsupported and required ------------------------------------------------------------


def test_missing_library_auto_is_unsupported() -> None:
    src = NvmlSource(FakeNvmlBackend(available=False))
    with pytest.raises(SourceUnsupported):
        asyncio.run(src.run(types.SimpleNamespace(emit=lambda _i: None)))


def test_missing_library_on_is_an_error() -> None:
    src = NvmlSource(FakeNvmlBackend(available=False), required=True)
    with pytest.raises(SourceError) as info:
        asyncio.run(src.run(types.SimpleNamespace(emit=lambda _i: None)))
    assert not isinstance(info.value, SourceUnsupported)


def test_real_backend_reports_unsupported_here() -> None:
    # This CPU machine has pynvml but no libnvidia-ml: the real backend must say unsupported.
    pytest.importorskip("pynvml")
    backend = PynvmlBackend()
    try:
        backend.init()
    except NvmlUnavailable:
        return
    backend.shutdown()
    pytest.skip("an NVIDIA driver is present on this machine")


class FakePynvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


def fake_pynvml(**overrides: Any) -> types.ModuleType:
    mod = types.ModuleType("pynvml_stand_in")
    consts = dict(
        NVML_ERROR_UNINITIALIZED=1,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_ERROR_NO_PERMISSION=4,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_ERROR_TIMEOUT=10,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_FUNCTION_NOT_FOUND=13,
        NVML_ERROR_GPU_IS_LOST=15,
        NVML_TEMPERATURE_GPU=0,
    )
    for k, v in consts.items():
        setattr(mod, k, v)
    mod.NVMLError = FakePynvmlError  # type: ignore[attr-defined]
    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    for k, v in overrides.items():
        setattr(mod, k, v)
    return mod


def raising(code: int) -> Any:
    def fn(*_a: Any) -> Any:
        raise FakePynvmlError(code)

    return fn


@pytest.mark.parametrize(
    ("code", "expected"),
    [(15, GpuLost), (3, FieldNotSupported), (4, FieldNotSupported), (13, FieldNotSupported), (999, NvmlError)],
)
def test_pynvml_errors_are_translated(code: int, expected: type[Exception]) -> None:
    backend = PynvmlBackend(fake_pynvml(nvmlDeviceGetTemperature=raising(code)))
    backend.init()
    with pytest.raises(expected) as info:
        backend.temperature(object())
    assert isinstance(info.value.__cause__, FakePynvmlError)


@pytest.mark.parametrize("code", [12, 9])
def test_pynvml_init_without_library_is_unavailable(code: int) -> None:
    with pytest.raises(NvmlUnavailable):
        PynvmlBackend(fake_pynvml(nvmlInit=raising(code))).init()


def test_pynvml_event_wait_timeout_is_none() -> None:
    backend = PynvmlBackend(fake_pynvml(nvmlEventSetWait_v2=raising(10)))
    backend.init()
    assert backend.event_wait("set", 10) is None


@pytest.mark.parametrize(("setting", "required"), [("auto", False), ("on", True), (True, True)])
def test_setting_mapping(setting: str | bool, required: bool) -> None:
    src = nvml_source_from_setting(setting, interval=2.0, backend=FakeNvmlBackend())
    assert src is not None and src.required is required and src.interval == 2.0


@pytest.mark.parametrize("setting", ["off", False])
def test_setting_off_is_no_source(setting: str | bool) -> None:
    assert nvml_source_from_setting(setting) is None


def test_config_defaults() -> None:
    cfg = NvmlSettings()
    assert (cfg.nvml, cfg.gpu_poll_interval, cfg.pcie_interval) == ("auto", 1.0, 30.0)


def test_stop_returns_while_thread_waits() -> None:
    backend = two_gpus()
    src = started(backend, event_timeout_ms=100)
    src.start_event_thread(lambda _e: None)
    assert backend.waiting.wait(2.0)
    t0 = time.monotonic()
    src.stop()
    assert time.monotonic() - t0 < 1.0
    assert not any(t.name == "nvml-events" and t.is_alive() for t in threading.enumerate())
