"""NVML source: a GpuSample per GPU every interval, and Xid events as they happen.

Polling runs in a worker thread (``asyncio.to_thread``) so that a slow or hung NVML call
never stalls the event loop. Per GPU:

- a reading that raises ``FieldNotSupported`` is skipped from then on (remembered per
  GPU, logged once); other ``NvmlError``s skip that reading this round only;
- PCIe replay (about 20x the cost of the other readings) is read every ``pcie_interval``;
  total energy and PCIe throughput (milliseconds a call) are never read;
- ``GpuLost`` yields one ``Event(kind=GPU_LOST, severity=CRITICAL)``; the GPU is then
  only retried every ``lost_retry_interval`` and never crashes the source.

Xid events: one daemon thread waits in ``nvmlEventSetWait_v2`` (``event_timeout_ms``
at a time, so it notices shutdown) and hands each event to the loop with
``loop.call_soon_threadsafe``. The ``nvml`` setting: ``off`` builds no source; ``auto``
reports the source unsupported when there is no NVML library or driver; ``on`` makes
that an error (``SourceError``), shown as down in the source status.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collector.model import Event, EventKind, GpuSample, Observation, Severity
from collector.sources.base import Sink, SourceError, SourceUnsupported
from collector.sources.nvml_backend import (
    XID_EVENT_TYPE,
    FieldNotSupported,
    GpuLost,
    NvmlBackend,
    NvmlError,
    NvmlEvent,
    PynvmlBackend,
)
from collector.sources.nvml_settings import DEFAULT_EVENT_TIMEOUT_MS, DEFAULT_INTERVAL, DEFAULT_LOST_RETRY, DEFAULT_PCIE_INTERVAL
from collector.xid.catalog import XidCatalog, default_catalog
from collector.xid.parser import XidParseError, normalize_bus_id

log = logging.getLogger(__name__)


@dataclass
class CallTiming:
    """How long one kind of NVML call took, over all GPUs."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    @property
    def mean_us(self) -> float:
        return self.total_s / self.count * 1e6 if self.count else 0.0


@dataclass
class GpuState:
    index: int
    handle: Any
    uuid: str | None = None
    bus_id: str | None = None  # canonical
    name: str | None = None
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    next_retry: float = 0.0
    last_pcie: float | None = None
    last_pcie_value: int | None = None
    lost_at_discovery: str | None = None  # GpuIsLost before the first poll: reported by it

    @property
    def key(self) -> str:
        return self.uuid or f"gpu{self.index}"


# The readings of one poll, in order; "pcie_replay" is the slow one.
READINGS = (
    "memory",
    "utilization",
    "temperature",
    "power_w",
    "sm_clock_mhz",
    "clock_event_reasons",
    "ecc_volatile",
    "remapped_rows",
    "pcie_replay",
    "compute_processes",
)


class NvmlSource:
    name = "nvml"

    def __init__(
        self,
        backend: NvmlBackend,
        *,
        interval: float = DEFAULT_INTERVAL,
        pcie_interval: float = DEFAULT_PCIE_INTERVAL,
        lost_retry_interval: float = DEFAULT_LOST_RETRY,
        event_timeout_ms: int = DEFAULT_EVENT_TIMEOUT_MS,
        xid_events: bool = True,
        gauges: bool = True,
        required: bool = False,
        clock: Callable[[], float] = time.time,
        catalog: XidCatalog | None = None,
    ) -> None:
        self.backend = backend
        self.interval = interval
        self.pcie_interval = pcie_interval
        self.lost_retry_interval = lost_retry_interval
        self.event_timeout_ms = event_timeout_ms
        self.xid_events = xid_events
        self.gauges = gauges  # False (gpu_metrics: dcgm): Xid events only, no polling
        self.required = required
        self._clock = clock
        self._catalog = catalog or default_catalog()
        self.gpus: list[GpuState] = []
        self.timings: dict[str, CallTiming] = {}
        self.errors = 0
        self.driver: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.event_thread_error: str | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and find the GPUs (sync; ``run`` calls it in a thread)."""
        try:
            self.backend.init()
        except SourceUnsupported as exc:
            if self.required:  # nvml: on -> a missing library is an error, shown as down
                raise SourceError(f"NVML required but unavailable: {exc}") from exc
            raise
        try:
            self.driver = self.backend.driver_version()
        except NvmlError:
            self.driver = None
        self.gpus = []
        for index in range(self.backend.device_count()):
            self.gpus.append(self._discover(index))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.event_timeout_ms / 1000 + 2)
            self._thread = None
        self.backend.shutdown()

    def _discover(self, index: int) -> GpuState:
        gpu = GpuState(index=index, handle=None)
        try:
            gpu.handle = self.backend.handle(index)
            gpu.uuid = self.backend.uuid(gpu.handle)
            gpu.name = self.backend.name(gpu.handle)
            try:
                gpu.bus_id = normalize_bus_id(self.backend.bus_id(gpu.handle))
            except XidParseError:
                gpu.bus_id = None
        except GpuLost as exc:
            gpu.lost_at_discovery = str(exc)
        except NvmlError as exc:  # retried like a lost GPU, without an event
            log.warning("NVML: GPU %d: %s", index, exc)
            gpu.lost = True
        return gpu

    async def run(self, sink: Sink) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.start)
        try:
            if self.xid_events:
                self.start_event_thread(lambda ev: loop.call_soon_threadsafe(sink.emit, ev))
            if not self.gauges:  # dcgm-exporter gives the gauges: nothing to poll
                await asyncio.Event().wait()
            next_tick = loop.time()
            while True:
                for item in await asyncio.to_thread(self.poll_once):
                    sink.emit(item)
                next_tick += self.interval
                delay = next_tick - loop.time()
                if delay < 0:  # fell behind (slow NVML): skip ticks, never burst
                    next_tick = loop.time()
                    delay = 0
                await asyncio.sleep(delay)
        finally:
            await asyncio.to_thread(self.stop)

    # -- polling -----------------------------------------------------------------------

    def poll_once(self) -> list[Observation]:
        """One sample per GPU that answers, and GPU_LOST events for those newly lost."""
        now = self._clock()
        out: list[Observation] = []
        for gpu in self.gpus:
            if gpu.lost_at_discovery is not None:
                out.append(self._lost(gpu, now, gpu.lost_at_discovery))
                gpu.lost_at_discovery = None
                continue
            if gpu.lost:
                if now < gpu.next_retry or not self._recover(gpu, now):
                    continue
            out.append(self._sample(gpu, now))
        return out

    def _recover(self, gpu: GpuState, now: float) -> bool:
        gpu.next_retry = now + self.lost_retry_interval
        try:
            gpu.handle = self.backend.handle(gpu.index)
            if gpu.uuid is None:
                gpu.uuid = self.backend.uuid(gpu.handle)
                gpu.name = self.backend.name(gpu.handle)
                gpu.bus_id = normalize_bus_id(self.backend.bus_id(gpu.handle))
        except (NvmlError, XidParseError):
            return False
        gpu.lost = False
        return True

    def _timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.timings.setdefault(name, CallTiming()).add(time.perf_counter() - t0)

    def _sample(self, gpu: GpuState, now: float) -> GpuSample | Event:
        read: dict[str, Any] = {}  # the sample's fields, as read (a sample is frozen once made)
        for reading in READINGS:
            if reading in gpu.unsupported:
                continue
            if reading == "pcie_replay" and gpu.last_pcie is not None and now - gpu.last_pcie < self.pcie_interval:
                read["pcie_replay"] = gpu.last_pcie_value  # carried forward between slow reads
                continue
            try:
                value = self._timed(reading, getattr(self.backend, reading), gpu.handle)
            except FieldNotSupported as exc:
                gpu.unsupported.add(reading)
                log.info("NVML: GPU %d does not support %s (%s); not asked again", gpu.index, reading, exc)
                continue
            except GpuLost as exc:
                return self._lost(gpu, now, exc)
            except NvmlError as exc:
                self.errors += 1
                log.debug("NVML: GPU %d %s failed: %s", gpu.index, reading, exc)
                continue
            _store(read, reading, value)
            if reading == "pcie_replay":
                gpu.last_pcie, gpu.last_pcie_value = now, read["pcie_replay"]
        return GpuSample(gpu=gpu.key, index=gpu.index, ts=now, bus_id=gpu.bus_id, name=gpu.name, **read)

    def _lost(self, gpu: GpuState, now: float, exc: Exception | str) -> Event:
        gpu.lost = True
        gpu.next_retry = now + self.lost_retry_interval
        return Event(
            kind=EventKind.GPU_LOST,
            ts=now,
            source="nvml",
            message=f"GPU {gpu.index} ({gpu.bus_id or gpu.key}) is lost: {exc}",
            severity=Severity.CRITICAL,
            gpu=gpu.bus_id or gpu.key,
            data={"index": gpu.index, "uuid": gpu.uuid, "error": str(exc)},
        )

    # -- Xid events --------------------------------------------------------------------

    def start_event_thread(self, deliver: Callable[[Event], Any]) -> None:
        """Start the daemon thread that waits for NVML events and calls ``deliver``.

        ``deliver`` runs on that thread: from ``run`` it is ``call_soon_threadsafe``.
        """
        self._stop.clear()
        self._thread = threading.Thread(target=self._event_loop, args=(deliver,), name="nvml-events", daemon=True)
        self._thread.start()

    def _event_loop(self, deliver: Callable[[Event], Any]) -> None:
        try:
            event_set = self.backend.event_set_create()
        except NvmlError as exc:
            self.event_thread_error = str(exc)
            return
        try:
            registered = 0
            for gpu in self.gpus:
                if gpu.handle is None:
                    continue
                try:
                    self.backend.register_xid_events(event_set, gpu.handle)
                    registered += 1
                except NvmlError as exc:
                    log.info("NVML: GPU %d gives no Xid events: %s", gpu.index, exc)
            if not registered:
                self.event_thread_error = "no GPU supports Xid events"
                return
            while not self._stop.is_set():
                try:
                    ev = self.backend.event_wait(event_set, self.event_timeout_ms)
                except NvmlError as exc:
                    # GpuLost is reported by the poller; other errors: back off, keep listening
                    self.event_thread_error = str(exc)
                    self._stop.wait(1.0)
                    continue
                if ev is not None:
                    deliver(self.xid_event(ev, self._clock()))
        finally:
            self.backend.event_set_free(event_set)

    def xid_event(self, ev: NvmlEvent, ts: float) -> Event:
        gpu = self.gpus[ev.index] if ev.index is not None and ev.index < len(self.gpus) else None
        where = (gpu.bus_id or gpu.key) if gpu else None
        if ev.event_type != XID_EVENT_TYPE:
            return Event(
                kind=EventKind.LOG,
                ts=ts,
                source="nvml",
                gpu=where,
                severity=Severity.INFO,
                message=f"NVML event type {ev.event_type:#x} data {ev.data}",
                data={"event_type": ev.event_type, "event_data": ev.data},
            )
        info = self._catalog.lookup(ev.data)
        lost = ev.data == 79
        return Event(
            kind=EventKind.GPU_LOST if lost else EventKind.XID,
            ts=ts,
            source="nvml",
            message=f"Xid {ev.data} ({info.name}) on GPU {ev.index} {where or ''}".rstrip(),
            severity=Severity.CRITICAL if lost else info.severity,
            gpu=where,
            xid=ev.data,
            data={
                "index": ev.index,
                "uuid": gpu.uuid if gpu else None,
                "gpu_instance_id": ev.gpu_instance_id,
                "compute_instance_id": ev.compute_instance_id,
                "catalog": info.to_dict(),
            },
        )


def _store(s: dict[str, Any], reading: str, value: Any) -> None:
    """A reading's value into the sample's fields."""
    if reading == "memory":
        s["memory_used"], s["memory_total"] = value
    elif reading == "utilization":
        s["utilization"], s["memory_utilization"] = value
    elif reading in ("temperature", "power_w", "sm_clock_mhz", "clock_event_reasons", "pcie_replay"):
        s[reading] = value
    elif reading == "ecc_volatile":
        s["ecc_volatile_uncorrected"], s["ecc_volatile_corrected"] = value
    elif reading == "remapped_rows":
        s["remapped_rows_correctable"] = value.correctable
        s["remapped_rows_uncorrectable"] = value.uncorrectable
        s["remapped_rows_pending"] = value.pending
    elif reading == "compute_processes":
        s["processes"] = [{"pid": pid, "used_memory": used} for pid, used in value]


def nvml_source_from_setting(
    setting: str | bool,
    *,
    interval: float = DEFAULT_INTERVAL,
    pcie_interval: float = DEFAULT_PCIE_INTERVAL,
    lost_retry_interval: float = DEFAULT_LOST_RETRY,
    event_timeout_ms: int = DEFAULT_EVENT_TIMEOUT_MS,
    xid_events: bool = True,
    gauges: bool = True,
    backend: NvmlBackend | None = None,
) -> NvmlSource | None:
    """The source the ``nvml`` setting asks for, or None for ``off``.

    YAML reads a bare ``off``/``on`` as a boolean: both spellings are accepted.
    """
    if isinstance(setting, bool):
        setting = "on" if setting else "off"
    value = setting.strip().lower()
    if value in ("off", "false", "no", "0"):
        return None
    if value not in ("auto", "on", "true", "yes", "1"):
        raise ValueError(f"nvml must be auto, on or off, not {setting!r}")
    return NvmlSource(
        backend or PynvmlBackend(),
        interval=interval,
        pcie_interval=pcie_interval,
        lost_retry_interval=lost_retry_interval,
        event_timeout_ms=event_timeout_ms,
        xid_events=xid_events,
        gauges=gauges,
        required=value != "auto",
    )
