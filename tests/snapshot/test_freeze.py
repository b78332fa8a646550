"""What a snapshot holds and how it is stored: triggers, the summary (failed workers and their
step), columnar request rows, the spliceable gzip parts, and one snapshot per engine for one
fault seen by several sources."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.ingest.hub import Hub, hub_for
from collector.model import (
    HALF_REQUESTS,
    HALF_STATS,
    Event,
    EventKind,
    GpuSample,
    Severity,
    StepRecord,
)
from collector.settings import EngineConfig, Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.snapshot.document import (
    PARTS,
    RequestTable,
    SnapshotDoc,
    assemble_gzip,
    crc32_combine,
    deflate_segment,
    export_gzip,
    pack,
    segment_of,
    unpack,
)
from collector.snapshot.freeze import (
    build_snapshot,
    is_trigger,
    request_table,
    summarize,
)
from collector.storage.connect import make_engine
from collector.storage.repo import Repository, SnapshotFilter
from tests.request_columns import Row, make_block, with_rows
from tests.wiring import with_committer


def steps(n: int, reqs: int, *, t0: float = 1000.0) -> list[StepRecord]:
    """Steps as the ring holds them once both halves came: stats, and the recorder's block."""
    out: list[StepRecord] = []
    prev = None
    for i in range(n):
        rows = [Row(f"r{j}", 32000, 32000 + i, i, mirror_rows=j) for j in range(reqs)]
        prev = make_block(i, t0 + i, rows, prev)
        out.append(
            StepRecord(engine="decode-0", ts=t0 + i, step=i, running=reqs, waiting=16 - reqs, request_block=prev, halves=HALF_STATS | HALF_REQUESTS)
        )
    return out


def ev(kind: EventKind, ts: float, **kw: object) -> Event:
    return Event(kind=kind, ts=ts, source=str(kw.pop("source", "log")), message=str(kw.pop("message", kind.value)), **kw)  # type: ignore[arg-type]


def test_triggers() -> None:
    assert is_trigger(ev(EventKind.XID, 1, severity=Severity.CRITICAL, xid=79))
    assert not is_trigger(ev(EventKind.XID, 1, severity=Severity.INFO, xid=63))
    assert is_trigger(ev(EventKind.ANOMALY, 1, severity=Severity.CRITICAL))
    assert not is_trigger(ev(EventKind.ANOMALY, 1, severity=Severity.WARNING))
    assert not is_trigger(ev(EventKind.CRASH_DUMP, 1))
    assert is_trigger(ev(EventKind.MANUAL, 1))


def test_failed_workers_get_the_step_they_were_in() -> None:
    recs = steps(10, 3)  # steps 0..9 at ts 1000..1009
    events = [
        ev(EventKind.CUDA_ERROR, 1007.5, process="Worker_TP0"),  # no step in the line: the last step before it
        ev(EventKind.CUDA_ERROR, 1007.6, process="Worker_TP1"),
        ev(EventKind.CUDA_ERROR, 1008.0, process="Worker_TP0"),  # a second report of TP0 does not move it
        ev(EventKind.XID, 1007.4, xid=43, source="kmsg"),
    ]
    s = summarize(recs, events)
    assert {p: f["step"] for p, f in s["failed_processes"].items()} == {"Worker_TP0": 7, "Worker_TP1": 7}
    assert s["xids"] == [43]
    # vLLM's crash dump names the step: it wins over the timestamps
    dump = ev(EventKind.CRASH_DUMP, 1009.0, data={"stats": {"step_counter": 8}})
    s = summarize(recs, events + [dump])
    assert s["failed_processes"]["Worker_TP1"] == {**s["failed_processes"]["Worker_TP1"], "step": 8, "step_from": "crash_dump"}
    assert s["peak_concurrency"] == 16 and s["running"] == 3
    assert s["requests_at_last_step"]["mirror_rows"] == {"r0": 0, "r1": 1, "r2": 2}
    assert s["requests_at_last_step"]["context_len_max"] == 32009
    # the last known figures, each with the step it is from; null where never known
    assert s["at_step"]["running"] == 9 and s["mirror_rows"] == 3 and s["at_step"]["mirror_rows"] == 9
    assert s["kv_cache_usage"] is None and s["at_step"]["kv_cache_usage"] is None
    assert s["host_blocks"] is None and s["requests_at_last_step"]["host_blocks"] == {"r0": None, "r1": None, "r2": None}
    assert s["steps_with_stats"] == 10 == s["steps_with_requests"]


def test_summary_takes_each_figure_from_the_last_step_that_knew_it() -> None:
    recs = steps(4, 2)
    recs.append(StepRecord(engine="decode-0", ts=1004.0, step=4, running=5, waiting=None, halves=HALF_STATS))
    recs.append(StepRecord(engine="decode-0", ts=1005.0, step=5))  # a step no half has filled in yet
    s = summarize(recs, [])
    assert s["last_step"] == 5
    assert (s["running"], s["at_step"]["running"]) == (5, 4)
    assert (s["waiting"], s["at_step"]["waiting"]) == (14, 3)  # step 4's waiting was unknown
    assert s["concurrency_at_fault"] == 19
    assert s["requests_at_last_step"]["step"] == 3  # the last step that carried its rows
    assert s["steps_with_stats"] == 5 and s["steps_with_requests"] == 4
    assert summarize([StepRecord(engine="d", ts=1.0, step=0)], [])["running"] is None


def test_the_cuda_graph_a_step_ran_travels_from_the_ring_to_the_summary_and_checklist() -> None:
    from collector.channel.codec import decode_many, encode_step
    from collector.snapshot.checklist import checklist
    from collector.snapshot.freeze import step_row

    graph = {"num_unpadded_tokens": 3, "num_padded_tokens": 8, "num_paddings": 5, "runtime_mode": "FULL"}
    sent = [
        StepRecord(
            engine="d",
            ts=1000.0,
            step=1,
            running=3,
            waiting=0,
            halves=HALF_STATS,
            details={"cudagraph": graph, "iteration": {"iteration_index": 1, "elapsed_ms": 9.5}},
        ),
        StepRecord(engine="d", ts=1000.1, step=2, running=3, waiting=0, halves=HALF_STATS),
    ]
    got = [obs for _, obs, _ in decode_many([encode_step(r) for r in sent], engine="d")]
    assert [g.details for g in got] == [sent[0].details, {}]  # type: ignore[union-attr]
    s = summarize(got, [])  # type: ignore[arg-type]
    assert s["cudagraph_at_last_step"] == {"step": 1, "runtime_mode": "FULL", "num_padded_tokens": 8, "num_unpadded_tokens": 3}
    assert step_row(got[0])["details"]["cudagraph"]["runtime_mode"] == "FULL" and step_row(got[1])["details"] is None  # type: ignore[arg-type]
    [item] = [
        i
        for i in checklist({"engine": "d", "summary": s, "fingerprint": {"cuda_graph_mode": "FULL_AND_PIECEWISE"}}, [], [])
        if i["key"] == "cuda_graph_mode"
    ]
    assert item["value"] == "FULL_AND_PIECEWISE" and item["detail"]["at_last_step"]["runtime_mode"] == "FULL"
    assert "cudagraph_at_last_step" not in summarize(got[1:], [])  # type: ignore[arg-type]


def test_request_table_reads_as_rows_and_round_trips() -> None:
    table = request_table(steps(3, 2))
    assert len(table) == 6
    assert table[-1] == {
        "step": 2,
        "request_id": "r1",
        "prompt_len": 32000,
        "computed_tokens": 32002,
        "output_tokens": 2,
        "preemptions": 0,
        "status": "running",
        "mirror_rows": 1,
        "host_blocks": None,
    }  # no row knew it: null, never 0
    assert RequestTable.coerce(json.loads(json.dumps(table.to_json()))) == table
    rows = [{"step": 1, "request_id": "a"}, {"step": 1, "request_id": "b", "extras": {"k": 1}}]
    sparse = RequestTable.from_rows(rows)
    assert list(sparse) == rows and sparse[0:1] == rows[:1]  # a sparse column is left out where absent


@given(st.binary(max_size=3000), st.binary(max_size=3000))
@settings(max_examples=200, deadline=None)
def test_crc32_combine_matches_zlib(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@given(st.lists(st.binary(max_size=5000), max_size=6))
@settings(max_examples=100, deadline=None)
def test_spliced_segments_are_one_valid_gzip_stream(pieces: list[bytes]) -> None:
    stored = [segment_of(pack(p.hex())) for p in pieces]
    assert all(s is not None for s in stored)
    blob = assemble_gzip([b"["] + [x for s in stored for x in (s, b",")][:-1] + [b"]"] if stored else [b"[]"])  # type: ignore[misc]
    assert json.loads(gzip.decompress(blob)) == [p.hex() for p in pieces]


def test_export_splices_stored_parts_and_reencodes_foreign_ones() -> None:
    doc = build_snapshot(
        host="h",
        engine="decode-0",
        trigger=ev(EventKind.XID, 1009, xid=43),
        steps=steps(5, 2),
        gpu_samples=[GpuSample(gpu="g", index=0, ts=1008)],
        events=[],
        log_lines=[],
        fingerprint={},
    )
    blobs = {name: pack(doc.part(name)) for name in PARTS}
    blobs["events"] = gzip.compress(json.dumps([{"kind": "xid"}]).encode())  # an older blob: not spliceable
    assert segment_of(blobs["events"]) is None and unpack(blobs["events"]) == [{"kind": "xid"}]
    rows = [{"step": 1, "request_id": "x"}]
    blobs["requests"] = gzip.compress(json.dumps(rows).encode())  # row form, as first written
    out = json.loads(gzip.decompress(export_gzip(doc.header(), blobs)))
    assert out["events"] == [{"kind": "xid"}] and out["steps"] == doc.steps
    assert SnapshotDoc.from_export(out).requests == rows
    assert deflate_segment(b"").length == 0


def _manager(url: str, tmp_path: Path, settings: Settings) -> tuple[Hub, Repository, SnapshotCommitter, list[int]]:
    repo = Repository(make_engine(url), host="node-a")
    done: list[int] = []
    hub, mgr = with_committer(
        settings, repo, spool_dir=tmp_path / "spool", settle_s=0.2, window_s=30, on_committed=[lambda doc, _: done.append(doc.id or 0)]
    )
    return hub, repo, mgr, done


def test_one_fault_seen_by_four_sources_is_one_snapshot_per_engine(migrated_url: str, tmp_path: Path) -> None:
    """An Xid on the GPU shared by two engines (kmsg and NVML), the CUDA error in each engine's
    log and /health failing on both: two snapshots (one per engine) in one incident."""
    settings = Settings(
        engines=[
            EngineConfig(name="decode-0", url="http://d", gpus=[1], pair="pd-0"),
            EngineConfig(name="decode-1", url="http://e", gpus=[1], pair="pd-1"),
            EngineConfig(name="prefill-0", url="http://p", gpus=[0], pair="pd-0"),
        ],
        ring_steps=64,
        host_name="node-a",
    )
    hub, repo, mgr, done = _manager(migrated_url, tmp_path, settings)
    for eng in settings.engines:  # as the service does at start
        repo.register_engine(eng.name, url=eng.url, pair=eng.pair)

    async def scenario() -> None:
        task = asyncio.create_task(mgr.run())
        now = time.time()
        hub.emit(GpuSample(gpu="GPU-1", index=1, ts=now, bus_id="00000000:00:06.0"))
        hub.emit(GpuSample(gpu="GPU-0", index=0, ts=now, bus_id="00000000:00:05.0"))
        for name in ("decode-0", "decode-1", "prefill-0"):
            for i in range(20):
                hub.emit(StepRecord(engine=name, ts=now - 1 + i * 0.01, step=i, running=2))
        hub.emit(
            Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message="Xid 43", xid=43, gpu="00000000:00:06.0", severity=Severity.CRITICAL)
        )
        hub.emit(Event(kind=EventKind.XID, ts=time.time(), source="nvml", message="Xid 43", xid=43, gpu="GPU-1", severity=Severity.CRITICAL))
        await asyncio.sleep(0.05)
        for name in ("decode-0", "decode-1"):
            hub.emit(
                Event(
                    kind=EventKind.CUDA_ERROR,
                    ts=time.time(),
                    source="log",
                    engine=name,
                    process="Worker_TP0",
                    message="CUDA error: unspecified launch failure",
                    severity=Severity.CRITICAL,
                )
            )
            hub.emit(
                Event(kind=EventKind.ENGINE_DOWN, ts=time.time(), source="scrape", engine=name, message="/health failing", severity=Severity.CRITICAL)
            )
        deadline = time.monotonic() + 15  # both snapshots committed and amended (a loaded CI is slow)
        while time.monotonic() < deadline:
            rows, _ = await asyncio.to_thread(repo.list_snapshots, SnapshotFilter())
            if len(rows) >= 2 and all("amended_at" in r["summary"] for r in rows):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # a third snapshot, were there one, would show by now
        task.cancel()

    asyncio.run(scenario())
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert sorted(r["engine"] for r in rows) == ["decode-0", "decode-1"]  # prefill-0 is on another GPU
    assert len({r["incident_id"] for r in rows}) == 1 and len(done) == 2
    doc = repo.get_snapshot(next(r["id"] for r in rows if r["engine"] == "decode-0"))
    assert {e["kind"] for e in doc.events} >= {"xid", "cuda_error", "engine_down"}  # the late witnesses, amended in
    assert doc.summary["failed_processes"]["Worker_TP0"]["step"] == 19
    assert [p["engine"] for p in doc.peers] == ["prefill-0"]


def test_a_capture_built_after_the_ring_gave_up_its_oldest_blocks_still_holds_them() -> None:
    from collector.snapshot.freeze import capture  # noqa: PLC0415

    rows = [Row(f"cmpl-{i:04d}", 100, 50) for i in range(32)]
    size = make_block(1, 1.0, rows).nbytes
    settings = Settings(engines=[EngineConfig(name="d0", url="http://d")], ring_request_bytes=1 << 16, ring_request_bytes_total=1 << 16)
    hub = hub_for(settings, clock=lambda: 1000.0)
    for n in range(1, 201):
        hub.emit(with_rows(StepRecord(engine="d0", ts=900.0 + n, step=n), rows))
    held = [s.step for s in hub.view.steps("d0") if s.request_block is not None]
    assert 0 < len(held) <= (1 << 16) // size < 200
    trigger = Event(kind=EventKind.XID, ts=1000.0, source="kmsg", message="Xid 79", severity=Severity.CRITICAL, engine="d0", xid=79)
    cap = capture(hub.view, "d0", trigger, gpu_seconds=60.0)
    for n in range(201, 401):  # the engine steps on while the snapshot waits to be built
        hub.emit(with_rows(StepRecord(engine="d0", ts=900.0 + n, step=n), rows))
    assert all(s.request_block is None for s in hub.view.steps("d0") if s.step in held)  # the ring gave them up
    assert all(s.request_block is not None for s in cap.steps if s.step in held)  # its records were not changed
    doc = cap.build()
    assert sorted(set(doc.requests.columns["step"])) == held
    assert [s["step"] for s in doc.steps if s["has_requests"]] == held
    assert all(s.request_block is None for s in hub.view.steps("d0") if s.step in held)  # nor the ring's by the build


def test_a_snapshot_holds_one_run_of_a_restarted_engine_never_both() -> None:
    from collector.snapshot.freeze import freeze  # noqa: PLC0415

    first, second = 1_765_000_000_000, 1_765_000_040_000  # the recorder's run ids (start times)
    hub = hub_for(Settings(engines=[EngineConfig(name="d0", url="http://d")]), clock=lambda: 1000.0)
    for n in range(1, 3215):  # the first run, SIGKILLed after 3,214 steps
        hub.emit(StepRecord(engine="d0", ts=100.0 + n / 100, step=n, running=4, run=first))
    for n in range(1, 301):  # started again: its steps count from 1
        hub.emit(StepRecord(engine="d0", ts=900.0 + n / 100, step=n, running=2, run=second))
    xid = Event(kind=EventKind.XID, ts=905.0, source="kmsg", message="Xid 79", severity=Severity.CRITICAL, engine="d0", xid=79)
    doc = freeze(hub.view, "d0", xid).to_export()
    assert [s["step"] for s in doc["steps"]] == list(range(1, 301))  # the new run alone
    assert {s["running"] for s in doc["steps"]} == {2}
    assert doc["summary"]["run"] == second
    assert doc["summary"]["previous_run"] == {"run": first, "ended_at": 1000.0, "steps_in_ring": 3214, "first_step": 1, "last_step": 3214}
    # the old run's death, read after the new run began, freezes the old run alone, marked so
    death = Event(
        kind=EventKind.RECORDER_SILENT, ts=906.0, source="recorder", message="gone", severity=Severity.CRITICAL, engine="d0", data={"run": first}
    )
    old = freeze(hub.view, "d0", death).to_export()
    assert [s["step"] for s in old["steps"]] == list(range(1, 3215))
    assert old["summary"]["run"] == first and old["summary"]["run_is_previous"] is True and old["summary"]["next_run"] == second
