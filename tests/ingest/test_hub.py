from __future__ import annotations

from collector.ingest.hub import Hub
from collector.model import Event, EventKind, GpuSample, Severity, StepRecord
from collector.settings import EngineConfig, Settings


class Due:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Event]] = []

    def snapshot_due(self, engine: str, trigger: Event) -> None:
        self.calls.append((engine, trigger))


def hub(**kw: object) -> tuple[Hub, Due]:
    engines = [EngineConfig(name="prefill-0", url="http://p", gpus=[0]), EngineConfig(name="decode-0", url="http://d", gpus=[1])]
    h = Hub(Settings(engines=engines, ring_steps=64, **kw), clock=lambda: 1000.0)  # type: ignore[arg-type]
    due = Due()
    h.snapshot_sink = due
    h.emit(GpuSample(gpu="GPU-a", index=0, ts=999.0, bus_id="0000:00:05.0"))
    h.emit(GpuSample(gpu="GPU-b", index=1, ts=999.0, bus_id="0000:00:06.0"))
    return h, due


def xid(source: str) -> Event:
    return Event(kind=EventKind.XID, ts=1000.0, source=source, message="Xid 43", xid=43, gpu="0000:00:06.0",
                 severity=Severity.WARNING)  # fmt: skip


def test_one_xid_from_two_sources_is_one_trigger_for_the_engine_on_that_gpu() -> None:
    h, due = hub()
    h.emit(xid("kmsg"))
    h.emit(xid("nvml"))
    assert [name for name, _ in due.calls] == ["decode-0"]
    assert sorted(due.calls[0][1].sources) == ["kmsg", "nvml"]
    assert h.xid_counts == {("0000:00:06.0", 43): 1}


def test_gpu_fault_with_no_mapping_goes_to_every_engine() -> None:
    h = Hub(Settings(engines=[EngineConfig(name="a", url="http://a"), EngineConfig(name="b", url="http://b")]))
    due = Due()
    h.snapshot_sink = due
    h.emit(xid("kmsg"))
    assert sorted(n for n, _ in due.calls) == ["a", "b"]


def test_engine_events_trigger_only_their_engine_and_info_does_not() -> None:
    h, due = hub()
    h.emit(Event(kind=EventKind.LOG, ts=1000.0, source="log", message="hello", engine="decode-0"))
    h.emit(Event(kind=EventKind.CUDA_ERROR, ts=1000.0, source="log", message="CUDA error", engine="prefill-0"))
    assert [n for n, _ in due.calls] == ["prefill-0"]


def test_freeze_takes_the_ring_the_gpu_of_the_engine_and_its_events() -> None:
    h, _ = hub()
    for i in range(100):
        h.emit(StepRecord(engine="decode-0", ts=900.0 + i, step=i, running=2))
    h.emit(xid("kmsg"))
    doc = h.freeze("decode-0", xid("kmsg"))
    assert len(doc.steps) == 64 and doc.steps[-1]["step"] == 99
    assert {s["gpu"] for s in doc.gpu_samples} == {"GPU-b"}
    assert [e["xid"] for e in doc.events] == [43]
    assert doc.summary["last_step"] == 99 and doc.summary["running"] == 2


def test_a_bad_record_never_escapes_emit() -> None:
    h, _ = hub()
    h.emit(StepRecord(engine="decode-0", ts=1.0, step="x"))  # type: ignore[arg-type]
    h.emit(StepRecord(engine="decode-0", ts=2.0, step=1))
    assert h.engines["decode-0"].ring.last() is not None
