from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from collector.ingest.hub import Hub, hub_for
from collector.ingest.intake import Intake
from collector.ingest.live import LiveView
from collector.model import (
    HALF_STATS,
    Event,
    EventKind,
    GpuSample,
    Severity,
    StepRecord,
    WorkloadArrival,
    WorkloadBatch,
)
from collector.settings import EngineConfig, Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.snapshot.freeze import freeze


class Due:
    """The trigger policy's decisions, read off a committer that is never run."""

    def __init__(self, view: LiveView, spool_dir: Path) -> None:
        self.committer = SnapshotCommitter(view, None, spool_dir=spool_dir, settle_s=5.0, window_s=60.0)  # type: ignore[arg-type]
        self.seen: list[tuple[Event, bool]] = []

    def consumers(self) -> list[Any]:
        return [self.committer.on_event, lambda ev, is_new: self.seen.append((ev, is_new))]

    @property
    def calls(self) -> list[tuple[str, Event]]:
        return [(o.engine, o.trigger) for o in self.committer.ledger.recent()]


def wired(settings: Settings, tmp_path: Path) -> tuple[Hub, Due]:
    intake = Intake(settings, clock=lambda: 1000.0)
    due = Due(LiveView(intake), tmp_path)
    return Hub(intake, consumers=due.consumers()), due


def hub(tmp_path: Path, **kw: object) -> tuple[Hub, Due]:
    engines = [EngineConfig(name="prefill-0", url="http://p", gpus=[0]), EngineConfig(name="decode-0", url="http://d", gpus=[1])]
    h, due = wired(Settings(engines=engines, ring_steps=64, **kw), tmp_path)  # type: ignore[arg-type]
    h.emit(GpuSample(gpu="GPU-a", index=0, ts=999.0, bus_id="0000:00:05.0"))
    h.emit(GpuSample(gpu="GPU-b", index=1, ts=999.0, bus_id="0000:00:06.0"))
    return h, due


def xid(source: str) -> Event:
    return Event(kind=EventKind.XID, ts=1000.0, source=source, message="Xid 43", xid=43, gpu="0000:00:06.0", severity=Severity.WARNING)


def test_one_xid_from_two_sources_is_one_trigger_for_the_engine_on_that_gpu(tmp_path: Path) -> None:
    h, due = hub(tmp_path)
    h.emit(xid("kmsg"))
    h.emit(xid("nvml"))
    assert [name for name, _ in due.calls] == ["decode-0"]
    assert due.committer.backlog == 1 and [o.engine for o in due.committer.ledger.still_open()] == ["decode-0"]
    assert sorted(due.calls[0][1].sources) == ["kmsg", "nvml"]
    assert h.view.xid_counts() == {("0000:00:06.0", 43): 1}
    # every event reaches the consumers, the merged second witness as not new; one uid
    assert [is_new for _, is_new in due.seen] == [True, False]
    assert due.seen[0][0].uid and due.seen[0][0].uid == due.seen[1][0].uid
    assert h.view.route(due.seen[0][0]).engines == ("decode-0",)


class QueuedEvents:
    """The writer's queue of events, as ``BatchWriter`` keeps it (steps and samples not kept)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def offer_steps(self, batch: Any) -> None: ...
    def offer_gpu(self, s: GpuSample) -> None: ...
    def offer_scrape(self, s: Any) -> None: ...
    def offer_fingerprint(self, engine: str, facts: dict[str, Any]) -> None: ...

    def offer_event(self, ev: Event) -> None:
        self.events.append(ev)

    def amend_event(self, ev: Event) -> None:
        self.events = [ev if e.uid == ev.uid else e for e in self.events]


def test_a_second_witness_changes_no_filed_event_and_every_holder_holds_the_merged_one(tmp_path: Path) -> None:
    engines = [EngineConfig(name="decode-0", url="http://d", gpus=[1])]
    rows = QueuedEvents()
    intake = Intake(Settings(engines=engines, ring_steps=64), rows=rows, clock=lambda: 1000.0)
    due = Due(LiveView(intake), tmp_path)
    h = Hub(intake, consumers=due.consumers())
    h.emit(GpuSample(gpu="GPU-b", index=1, ts=999.0, bus_id="0000:00:06.0"))
    h.emit(xid("nvml"))
    [(first, _)] = due.seen
    filed = copy.deepcopy(first)
    h.emit(dataclasses.replace(xid("kmsg"), pid=415, lines=["NVRM: Xid (PCI:0000:00:06): 43, pid=415"]))
    merged, is_new = due.seen[-1]
    assert not is_new and merged is not first and merged.uid == first.uid
    assert first == filed and first.sources == ["nvml"] and first.pid is None  # as it was filed
    assert merged.sources == ["nvml", "kmsg"] and merged.pid == 415
    # one event, the merged one, wherever the first was held: the rings, the writer's queue, the
    # open snapshot (which commits and links it)
    assert h.view.events("decode-0", since=0.0) == [merged]
    assert rows.events == [merged]
    assert [o.trigger for o in due.committer.ledger.recent()] == [merged]


def test_gpu_fault_with_no_mapping_goes_to_every_engine(tmp_path: Path) -> None:
    h, due = wired(Settings(engines=[EngineConfig(name="a", url="http://a"), EngineConfig(name="b", url="http://b")]), tmp_path)
    h.emit(xid("kmsg"))
    assert sorted(n for n, _ in due.calls) == ["a", "b"]
    assert due.committer.backlog == 2 and due.committer.queue._queue.qsize() == 1  # one batch: committed together
    # another GPU's fault that matches no engine either: late evidence of the open snapshots (which
    # engine it hit is unknown), not a second snapshot of every engine
    h.emit(dataclasses.replace(xid("kmsg"), gpu="0000:00:07.0", uid=""))
    assert len(due.calls) == 2 and due.committer.backlog == 2


def test_a_second_gpus_fault_routed_to_its_engine_opens_its_own_snapshot(tmp_path: Path) -> None:
    h, due = wired(Settings(engines=[EngineConfig(name="tp2", url="http://t", gpus=[0, 1])]), tmp_path)
    h.emit(GpuSample(gpu="GPU-a", index=0, ts=999.0, bus_id="0000:00:05.0"))
    h.emit(GpuSample(gpu="GPU-b", index=1, ts=999.0, bus_id="0000:00:06.0"))
    h.emit(dataclasses.replace(xid("kmsg"), gpu="0000:00:05.0"))
    h.emit(xid("kmsg"))  # GPU 1, same code, within the window
    h.emit(dataclasses.replace(xid("nvml"), gpu="GPU-a", xid=31))  # GPU 0 again (named by NVML's id): joins its own
    assert [e.gpu for _, e in due.calls] == ["0000:00:05.0", "0000:00:06.0"]
    first, second = due.committer.ledger.recent()
    assert [e.gpu for e in first.late] == ["GPU-a"] and not second.late


def test_engine_events_trigger_only_their_engine_and_info_does_not(tmp_path: Path) -> None:
    h, due = hub(tmp_path)
    h.emit(Event(kind=EventKind.LOG, ts=1000.0, source="log", message="hello", engine="decode-0"))
    h.emit(Event(kind=EventKind.CUDA_ERROR, ts=1000.0, source="log", message="CUDA error", engine="prefill-0"))
    assert [n for n, _ in due.calls] == ["prefill-0"]
    assert [o.engine for o in due.committer.ledger.still_open()] == ["prefill-0"]
    assert len(due.seen) == 2  # the LOG event still reaches every consumer
    assert [e.message for e in h.intake.store.engines["decode-0"].events] == ["hello"]


def test_freeze_takes_the_ring_the_gpu_of_the_engine_and_its_events(tmp_path: Path) -> None:
    h, _ = hub(tmp_path)
    for i in range(100):
        h.emit(StepRecord(engine="decode-0", ts=900.0 + i, step=i, running=2, halves=HALF_STATS))
    h.emit(xid("kmsg"))
    doc = freeze(h.view, "decode-0", xid("kmsg"))
    assert len(doc.steps) == 64 and doc.steps[-1]["step"] == 99
    assert {s["gpu"] for s in doc.gpu_samples} == {"GPU-b"}
    assert [e["xid"] for e in doc.events] == [43]
    assert doc.summary["last_step"] == 99 and doc.summary["running"] == 2
    assert doc.summary["at_step"]["running"] == 99
    # figures no half carried are unknown (null), never 0
    assert doc.steps[-1]["waiting"] is None and doc.steps[-1]["kv_cache_usage"] is None
    assert doc.summary["waiting"] is None and doc.summary["at_step"]["waiting"] is None
    assert doc.summary["concurrency_at_fault"] is None
    assert doc.steps[-1]["has_requests"] is False and doc.steps[-1]["has_stats"] is True


def test_a_bad_record_never_escapes_emit(tmp_path: Path) -> None:
    h, _ = hub(tmp_path)
    h.emit(StepRecord(engine="decode-0", ts=1.0, step="x"))  # type: ignore[arg-type]
    h.emit(StepRecord(engine="decode-0", ts=2.0, step=1))
    assert h.intake.store.engines["decode-0"].window.last() is not None
    assert h.view.dropped == 1


def test_a_steps_finished_request_list_is_not_held_but_its_count_is(tmp_path: Path) -> None:
    h, _ = hub(tmp_path)
    finished = [{"request_id": f"r{i}", "finish_reason": "length", "e2e_latency": 1.5} for i in range(3)]
    h.emit(StepRecord(engine="decode-0", ts=999.5, step=1, running=4, finished=3, finished_requests=finished, halves=HALF_STATS))
    [held] = h.view.steps("decode-0")
    assert held.finished == 3 and held.finished_requests == []


def test_the_nodes_request_bytes_are_shared_by_its_engines_and_an_engine_that_joins_takes_its_share(tmp_path: Path) -> None:
    from tests.request_columns import Row, with_rows  # noqa: PLC0415

    settings = Settings(engines=[EngineConfig(name="e0", url="http://a")], ring_request_bytes=1 << 20, ring_request_bytes_total=3 << 19)
    h = hub_for(settings, clock=lambda: 1000.0)
    assert h.intake.store.engines["e0"].window.max_request_bytes == 1 << 20  # alone: its own bound is the smaller
    rows = [Row(f"cmpl-{i:04d}", 100, 50) for i in range(64)]
    for n in range(1, 2001):
        h.emit(with_rows(StepRecord(engine="e0", ts=float(n), step=n), rows))
    before = h.intake.store.engines["e0"].window.request_bytes
    assert (1 << 20) - 4096 < before <= 1 << 20
    h.emit(with_rows(StepRecord(engine="e1", ts=1.0, step=1), rows))  # a second engine joins
    for st in h.intake.store.engines.values():
        assert st.window.max_request_bytes == 3 << 18  # half the node's budget each
    ring = h.intake.store.engines["e0"].window
    assert ring.request_bytes <= 3 << 18 < before  # e0 gave up its oldest blocks at once
    kept = ring.steps()
    assert len(kept) == 2000 and kept[-1].request_block is not None and kept[0].request_block is None


def test_scrapes_are_kept_as_long_as_their_readers_need_and_no_longer() -> None:
    from collector.model import MetricsScrape  # noqa: PLC0415

    settings = Settings(engines=[EngineConfig(name="e0", url="http://a")])
    kept = hub_for(settings, clock=lambda: 1000.0, scrape_seconds=60.0)
    unbounded = hub_for(settings, clock=lambda: 1000.0)
    for i in range(200):
        for h in (kept, unbounded):
            h.emit(MetricsScrape(engine="e0", ts=1000.0 + i, values={"num_requests_running": 1.0}))
    assert [s.ts for s in kept.intake.store.engines["e0"].scrapes] == [1000.0 + i for i in range(139, 200)]  # the last 60 s
    assert len(unbounded.intake.store.engines["e0"].scrapes) == 200  # told nothing: only the count bound (900)


def test_a_poll_filed_in_one_call_is_filed_as_one_by_one_and_a_bad_step_is_set_aside_alone(tmp_path: Path) -> None:
    from tests.request_columns import Row, with_rows  # noqa: PLC0415

    rows = [Row("cmpl-a", 100, 50), Row("cmpl-b", 10, 5, status="preempted")]

    def poll() -> list[Any]:
        steps: list[Any] = [with_rows(StepRecord(engine="decode-0", ts=1000.0 + n / 100, step=n, run=7), rows) for n in range(1, 6)]
        steps.insert(2, StepRecord(engine="decode-0", ts=1000.5, step="x"))  # type: ignore[arg-type]
        steps.insert(4, GpuSample(gpu="GPU-b", index=1, ts=1000.2, bus_id="0000:00:06.0"))
        steps += [
            StepRecord(engine="prefill-0", ts=1000.1, step=9, running=3, halves=HALF_STATS),
            StepRecord(engine="decode-0", ts=1000.3, step=1, running=2, run=7, halves=HALF_STATS),
        ]
        return steps

    one, _ = hub(tmp_path / "one")
    for obs in poll():
        one.emit(obs)
    many, _ = hub(tmp_path / "many")
    many.emit_many(poll())
    for h in (one, many):
        assert h.view.dropped == 1
    for name in ("decode-0", "prefill-0"):
        a, b = one.view.engine(name), many.view.engine(name)
        assert a is not None and b is not None
        assert (b.steps_received, b.requests_received, b.last_seen, b.up) == (a.steps_received, a.requests_received, a.last_seen, a.up)
        assert [(s.step, s.running, s.halves, s.request_count) for s in many.view.steps(name)] == [
            (s.step, s.running, s.halves, s.request_count) for s in one.view.steps(name)
        ]
    info = many.view.engine("decode-0")
    assert info is not None and (info.steps_received, info.requests_received, info.last_seen) == (6, 10, 1000.3)
    assert len(many.intake.store.gpus["GPU-b"]) == 2


def test_reading_the_workload_changes_nothing_and_a_routed_crash_closes_what_was_open(tmp_path: Path) -> None:
    """The view reads; ingest's front door writes: the engine's death enters its workload log
    when the crash is routed to it, never when a reader exports the log."""
    h, _ = hub(tmp_path)
    h.emit(WorkloadBatch(engine="decode-0", ts=990.0, records=[WorkloadArrival("a", 990.0, 10, 5, 1, True, False)]))
    h.emit(WorkloadBatch(engine="prefill-0", ts=990.0, records=[WorkloadArrival("p", 990.0, 10, 5, 1, True, False)]))
    log = h.intake.store.engines["decode-0"].workload
    before = repr(log.__dict__)  # (a NaN, an open request's end, equals nothing, not even itself)
    first = h.view.workload("decode-0", 1000.0, crashed=True)
    assert repr(log.__dict__) == before and first == h.view.workload("decode-0", 1000.0, crashed=True)
    assert first["counts"]["failed_by_crash"] == 1
    h.emit(Event(kind=EventKind.CUDA_ERROR, ts=1000.0, source="log", message="CUDA error", engine="decode-0"))
    assert h.view.workload("decode-0", 1000.0, crashed=True) == first  # the snapshot's amendment agrees
    # the restarted engine's load starts after the death; the other engine did not die
    h.emit(WorkloadBatch(engine="decode-0", ts=1100.0, records=[WorkloadArrival("b", 1100.0, 10, 5, 1, True, False)]))
    later = h.view.workload("decode-0", 1200.0, crashed=False)
    assert later["window"]["after_death_at"] == 1000.0 and later["requests"]["columns"]["id"] == ["b"]
    assert h.view.workload("prefill-0", 1200.0, crashed=False)["window"]["after_death_at"] is None
