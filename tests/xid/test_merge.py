"""Merging the kernel log's and NVML's reports of one fault."""

from __future__ import annotations

import copy

from collector.model import Event, EventKind, Severity
from collector.xid.merge import XidMerger


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def kmsg(xid: int, ts: float, gpu: str = "0000:00:06.0", pid: int | None = 415, kind: EventKind = EventKind.XID) -> Event:
    return Event(
        kind=kind,
        ts=ts,
        source="kmsg",
        message=f"NVRM: Xid (PCI:0000:00:06): {xid}, pid={pid}",
        severity=Severity.WARNING,
        gpu=gpu,
        xid=xid,
        pid=pid,
        data={"name": "python3"},
    )


def nvml(xid: int | None, ts: float, gpu: str = "0000:00:06.0", kind: EventKind = EventKind.XID, severity: Severity = Severity.WARNING) -> Event:
    return Event(kind=kind, ts=ts, source="nvml", message=f"Xid {xid}", severity=severity, gpu=gpu, xid=xid, data={"uuid": "GPU-1", "name": None})


def test_nvml_then_kmsg_within_window_is_one_event() -> None:
    clock = Clock()
    m = XidMerger(2.0, clock=clock)
    first, new = m.offer(nvml(43, 1000.000))
    assert new
    merged, new2 = m.offer(kmsg(43, 1000.002))
    assert not new2 and merged is not first and merged.uid == first.uid
    assert merged.sources == ["nvml", "kmsg"]
    assert merged.pid == 415 and merged.data["name"] == "python3" and merged.data["uuid"] == "GPU-1"
    assert set(merged.data["witnesses"]) == {"nvml", "kmsg"}
    assert merged.message.startswith("NVRM: Xid")  # the kernel's line says more


def test_kmsg_then_nvml_keeps_kernel_message() -> None:
    m = XidMerger(2.0, clock=Clock())
    first, _ = m.offer(kmsg(31, 1000.0))
    merged, new = m.offer(nvml(31, 1000.01))
    assert not new and merged.pid == 415 and merged.sources == ["kmsg", "nvml"]
    assert merged.message.startswith("NVRM: Xid")


def test_a_merge_changes_no_event_it_published_or_was_given() -> None:
    m = XidMerger(2.0, clock=Clock())
    first, _ = m.offer(nvml(43, 1000.0))
    published = copy.deepcopy(first)
    second = kmsg(43, 1000.002)
    merged, new = m.offer(second)
    assert not new and merged.sources == ["nvml", "kmsg"] and merged.pid == 415
    # the event published first is as it was published: the merge made a new one
    assert first == published and first.sources == ["nvml"] and first.pid is None
    assert first.data == published.data and set(first.data["witnesses"]) == {"nvml"}
    assert second == kmsg(43, 1000.002)


def test_outside_window_is_two_events() -> None:
    m = XidMerger(2.0, clock=Clock(1003.0))
    m.offer(nvml(43, 1000.0))
    _, new = m.offer(kmsg(43, 1002.5))
    assert new


def test_other_gpu_or_xid_is_another_event() -> None:
    m = XidMerger(2.0, clock=Clock())
    m.offer(nvml(43, 1000.0))
    assert m.offer(kmsg(43, 1000.0, gpu="0000:3b:00.0"))[1]
    assert m.offer(kmsg(31, 1000.0))[1]


def test_same_source_twice_is_two_faults() -> None:
    m = XidMerger(2.0, clock=Clock())
    assert m.offer(kmsg(43, 1000.0, pid=1))[1]
    assert m.offer(kmsg(43, 1000.5, pid=2))[1]
    # ... and the NVML witness joins the first of them
    merged, new = m.offer(nvml(43, 1000.6))
    assert not new and merged.pid == 1


def test_uuid_alias_matches_bus_id() -> None:
    m = XidMerger(2.0, clock=Clock())
    m.alias("GPU-abc", "0000:00:06.0")
    m.offer(kmsg(43, 1000.0))
    _, new = m.offer(nvml(43, 1000.1, gpu="GPU-abc"))
    assert not new


def test_gpu_lost_lines_merge_and_upgrade() -> None:
    m = XidMerger(2.0, clock=Clock())
    first, _ = m.offer(kmsg(79, 1000.0, pid=None, kind=EventKind.GPU_LOST))
    # the kernel's second line for the same loss, then NVML's GpuIsLost (no Xid)
    assert not m.offer(kmsg(79, 1000.1, pid=None, kind=EventKind.GPU_LOST))[1]
    merged, new = m.offer(nvml(None, 1000.5, kind=EventKind.GPU_LOST, severity=Severity.CRITICAL))
    assert not new and merged.uid == first.uid and first.severity is Severity.WARNING
    assert merged.severity is Severity.CRITICAL and merged.sources == ["kmsg", "nvml"]


def test_xid79_and_gpu_lost_are_one_fault() -> None:
    m = XidMerger(2.0, clock=Clock())
    first, _ = m.offer(nvml(79, 1000.0))
    merged, new = m.offer(kmsg(79, 1000.0, kind=EventKind.GPU_LOST))
    assert not new and merged.kind is EventKind.GPU_LOST


def test_non_xid_events_pass_through() -> None:
    m = XidMerger(2.0, clock=Clock())
    e = Event(kind=EventKind.CUDA_ERROR, ts=1000.0, source="log", message="x")
    assert m.offer(e) == (e, True)
    assert m.offer(e)[1]


def test_old_entries_expire() -> None:
    clock = Clock()
    m = XidMerger(2.0, clock=clock)
    m.offer(nvml(43, 1000.0))
    clock.t = 1010.0
    m.offer(nvml(31, 1010.0))
    assert len(m._recent) == 1
