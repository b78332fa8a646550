from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from collector.ingest.hub import Hub
from collector.model import HALF_STATS, Event, EventKind, Fingerprint, GpuSample, LogLine, Severity, StepRecord
from collector.settings import EngineConfig, Settings
from collector.snapshot import intent, spool
from collector.snapshot.committer import SnapshotCommitter
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository, SnapshotFilter
from collector.storage.writer import BatchWriter
from tests.request_columns import Row, with_rows
from tests.wiring import with_committer


def setup(
    url: str, tmp_path: Path, settle: float = 0.2, *, late: list[StepRecord] | None = None, engines: int = 1, **kw: Any
) -> tuple[Hub, Repository, SnapshotCommitter, list[int]]:
    """``late``: steps the recorder published and the sidecar has not polled yet (read before a
    capture); ``engines`` configured without GPUs (decode-0, decode-1, ...)."""
    names = ["decode-0", *[f"decode-{i}" for i in range(1, engines)]]
    settings = Settings(engines=[EngineConfig(name=n, url=f"http://{n}") for n in names], ring_steps=32, host_name="node-a")
    repo = Repository(make_engine(url), host="node-a")
    writer = BatchWriter(repo, interval=0.05, hold_s=0.0)
    committed: list[int] = []

    def read_now() -> None:
        for s in late or []:
            if not hub.view.has_step(s.engine, s.step):
                hub.intake.emit(s)

    hub, c = with_committer(
        settings,
        repo,
        rows=writer,
        spool_dir=tmp_path / "spool",
        settle_s=settle,
        window_s=30,
        on_committed=[lambda doc, ev: committed.append(doc.id)],
        retry_every=0.1,
        read_now=read_now,
        **kw,
    )
    c.writer = writer  # type: ignore[attr-defined]
    return hub, repo, c, committed


def fault(kind: EventKind, source: str, msg: str, **kw: Any) -> Event:
    return Event(kind=kind, ts=time.time(), source=source, message=msg, engine="decode-0", severity=Severity.CRITICAL, **kw)


def step(i: int, **kw: Any) -> StepRecord:
    kw.setdefault("running", 4)
    return StepRecord(
        engine="decode-0",
        ts=time.time(),
        step=i,
        waiting=0,
        kv_cache_usage=0.032,
        preemptions=0,
        prompt_tokens=0,
        generation_tokens=4,
        halves=HALF_STATS,
        **kw,
    )


async def manual(hub: Hub, c: SnapshotCommitter, reason: str, wait_s: float = 5.0) -> int | None:
    """A manual trigger through the hub; its snapshot's id once committed."""
    ev = Event(kind=EventKind.MANUAL, ts=time.time(), source="api", message=reason, engine="decode-0")
    hub.emit(ev)
    [o] = c.opens_for(ev)
    assert o.committed is not None
    return await asyncio.wait_for(o.committed, wait_s)


async def _run(c: SnapshotCommitter, body: Any) -> None:
    task = asyncio.create_task(c.run())
    try:
        await body()
    finally:
        await c.writer.flush(everything=True)  # type: ignore[attr-defined]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_four_witnesses_one_snapshot_amended_with_the_late_evidence(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path)

    async def body() -> None:
        for i in range(50):
            hub.emit(step(i))
        hub.emit(fault(EventKind.XID, "kmsg", "Xid 43", xid=43))
        await asyncio.sleep(0.05)
        # late witnesses of the same fault, and the last steps the recorder flushed
        for i in range(50, 53):
            hub.emit(step(i))
        hub.emit(LogLine("decode-0", time.time(), "(Worker_TP0 pid=1) ERROR CUDA error: unspecified launch failure"))
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "CUDA error: unspecified launch failure"))
        hub.emit(fault(EventKind.ENGINE_FATAL, "log", "EngineCore encountered a fatal error."))
        hub.emit(fault(EventKind.ENGINE_DOWN, "scrape", "health failing"))
        # the amendment comes settle_s (0.2 s) after the trigger: wait for it, not a fixed time
        # (a loaded machine once read the first commit after a 0.6 s sleep)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows, _ = await asyncio.to_thread(repo.list_snapshots, SnapshotFilter())
            if rows and rows[0]["summary"].get("amended_at"):
                break
            await asyncio.sleep(0.05)

    asyncio.run(_run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 1 and committed == [rows[0]["id"]] and rows[0]["summary"].get("amended_at")
    doc = repo.get_snapshot(rows[0]["id"])
    assert doc.trigger["kind"] == "xid"
    assert doc.steps[-1]["step"] == 52  # the amendment holds the steps that came after the trigger
    assert {e["kind"] for e in doc.events} >= {"xid", "cuda_error", "engine_fatal", "engine_down"}
    assert any("unspecified launch failure" in line["line"] for line in doc.log_lines)
    assert not spool.pending(tmp_path / "spool")
    # every witness's stored row links the snapshot, found by the id it got at ingest
    linked = {e["kind"] for e in repo.list_events() if e["snapshot_id"] == rows[0]["id"]}
    assert linked >= {"xid", "cuda_error", "engine_fatal", "engine_down"}


def test_a_later_distinct_fault_after_the_amendment_gets_its_own_snapshot_in_the_same_incident(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=0.1)

    async def body() -> None:
        for i in range(10):
            hub.emit(step(i))
        hub.emit(fault(EventKind.XID, "kmsg", "Xid 43", xid=43))
        await asyncio.sleep(0.5)  # committed and amended
        for i in range(10, 20):
            hub.emit(step(i))
        hub.emit(fault(EventKind.XID, "kmsg", "Xid 43 again", xid=43))  # the same code: a witness
        hub.emit(fault(EventKind.XID, "kmsg", "Xid 31", xid=31))  # a new fault
        await asyncio.sleep(0.5)

    asyncio.run(_run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 2 and sorted(committed) == sorted(r["id"] for r in rows)
    first, second = sorted(rows, key=lambda r: r["id"])
    assert first["incident_id"] == second["incident_id"]
    assert "Xid 31" in second["trigger_message"] and second["last_step"] == 19
    assert first["last_step"] == 9
    ev31 = next(e for e in repo.list_events() if e["message"] == "Xid 31")
    assert ev31["snapshot_id"] == second["id"]  # the alert and the row link the snapshot that holds it


def test_a_restarted_engines_fault_inside_the_old_runs_window_is_its_own_snapshot_of_its_own_run(migrated_url: str, tmp_path: Path) -> None:
    """A container restarted within the incident window: the old run's death (its ring gone
    silent, naming its run), then the new run's CUDA error seconds later. Two snapshots, each
    of one run, never the new run's fault as late evidence of the old run's death."""
    old, new = 1_765_000_000_000, 1_765_000_020_000  # the recorder's run ids (start times)
    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=0.1)

    async def body() -> None:
        for i in range(1, 21):
            hub.emit(step(i, run=old))
        for i in range(1, 6):  # started again: steps count from 1
            hub.emit(step(i, run=new))
        hub.emit(fault(EventKind.RECORDER_SILENT, "recorder", "old run's ring went silent", data={"run": old}))
        await asyncio.sleep(0.3)
        for i in range(6, 11):
            hub.emit(step(i, run=new))
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "CUDA error: unspecified launch failure"))
        await asyncio.sleep(0.5)

    asyncio.run(_run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 2 and sorted(committed) == sorted(r["id"] for r in rows)
    death, crash = sorted(rows, key=lambda r: r["id"])
    assert death["trigger_kind"] == "recorder_silent" and death["last_step"] == 20  # the old run alone
    assert crash["trigger_kind"] == "cuda_error" and crash["last_step"] == 10  # the new run alone
    doc = repo.get_snapshot(crash["id"])
    assert doc.summary["run"] == new and [s["step"] for s in doc.steps] == list(range(1, 11))


def test_manual_snapshots_are_each_their_own_with_an_id(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path)
    ids: list[int | None] = []

    async def body() -> None:
        hub.emit(step(1))
        for n in range(3):
            ids.append(await manual(hub, c, f"drill {n}"))

    asyncio.run(_run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 3 and sorted(ids) == sorted(r["id"] for r in rows)  # type: ignore[type-var]


def test_nul_bytes_in_a_trigger_and_its_evidence_neither_wedge_nor_block_later_snapshots(pg_url: str, tmp_path: Path) -> None:
    # Postgres refuses \x00 in text and JSON: a manual reason, a log line and an engine's
    # fingerprint with one were retried forever and held every later snapshot behind them
    upgrade(pg_url)
    hub, repo, c, _ = setup(pg_url, tmp_path)
    ids: list[int | None] = []

    async def body() -> None:
        hub.emit(step(1))
        hub.emit(LogLine("decode-0", time.time(), "ERROR bad\x00line"))
        hub.emit(Fingerprint("decode-0", time.time(), {"model": "m\x00", "env\x00": {"K": "v\x00"}}))
        for reason in ("nul\x00reason", "after it"):
            ids.append(await manual(hub, c, reason, wait_s=10))
        for _ in range(200):  # and their amendments (settle_s after each capture) are committed too
            if all(o.amended for o in c.ledger.recent()):
                break
            await asyncio.sleep(0.05)
        await c.queue.join(10)

    asyncio.run(_run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 2 and None not in ids
    first = repo.get_snapshot(min(r["id"] for r in rows))
    assert first.trigger["message"] == "nul\ufffdreason"  # stored NUL-free, as every text column
    assert {r["trigger_message"] for r in rows} == {"nul\ufffdreason", "after it"}
    [incident] = repo.list_incidents()
    assert "nul\ufffdreason" in incident["title"]
    assert not spool.pending(tmp_path / "spool") and c.backlog == 0


def test_database_down_spools_and_commits_when_back_with_the_fault_time_rings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'f.db'}"
    (tmp_path / "db").mkdir()
    hub, repo, c, committed = setup(url, tmp_path, settle=0.05)

    async def body() -> None:
        for i in range(5):
            hub.emit(step(i))
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "CUDA error"))  # no tables: the commit fails
        await asyncio.sleep(0.3)
        assert not committed and spool.pending(tmp_path / "spool")
        for i in range(5, 40):  # the engine goes on stepping while the database is down
            hub.emit(step(i))
        await asyncio.to_thread(upgrade, url)
        for _ in range(50):
            if committed:
                break
            await asyncio.sleep(0.1)

    asyncio.run(_run(c, body))
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 1 and committed == [rows[0]["id"]]
    # captured at the fault: its steps end where the fault was, not when the database came back
    # (the amendment, captured 0.05 s later, is the version that waited)
    assert rows[0]["last_step"] == 4
    assert not spool.pending(tmp_path / "spool")


def test_a_spooled_snapshot_survives_a_restart_and_garbage_in_the_spool_is_set_aside(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, _ = setup(migrated_url, tmp_path)
    rows = [Row(request_id=f"r{i}", prompt_len=100, computed_tokens=10 + i) for i in range(3)]
    hub.emit(with_rows(StepRecord(engine="decode-0", ts=time.time(), step=7), rows))
    cap = c.policy.capture_one("decode-0", fault(EventKind.MANUAL, "api", "before the restart"))
    from collector.snapshot.commit import _build

    doc, blobs = _build(cap)
    spool_dir = tmp_path / "spool"
    spool.write(
        spool_dir,
        "snapshot-1.000000-decode-0-aaaa.spool",
        doc.header(),
        {
            "incident_key": "manual:1",
            "trigger_uid": "aaaa",
            "snapshot_id": None,
            "counts": {"step_count": 1, "request_rows": 3, "first_step": 7, "last_step": 7},
        },
        blobs,
    )
    (spool_dir / "snapshot-2.000000-decode-0-trunc.spool").write_bytes(spool.MAGIC + b'{"header"')  # a torn write
    (spool_dir / "snapshot-3.000000-decode-0-junk.spool").write_bytes(b"\x00" * 100)

    hub2, repo2, c2, _ = setup(migrated_url, tmp_path)  # a new sidecar over the same spool

    async def body() -> None:
        for _ in range(200):  # the recovery at start commits it and sets the garbage aside
            if not spool.pending(spool_dir):
                break
            await asyncio.sleep(0.05)

    asyncio.run(_run(c2, body))
    stored, _ = repo2.list_snapshots(SnapshotFilter())
    assert len(stored) == 1 and stored[0]["trigger_message"] == "before the restart"
    back = repo2.get_snapshot(stored[0]["id"])
    assert [r["request_id"] for r in back.requests] == ["r0", "r1", "r2"]
    assert sorted(p.name for p in spool_dir.iterdir()) == ["snapshot-2.000000-decode-0-trunc.spool.bad", "snapshot-3.000000-decode-0-junk.spool.bad"]
    # and the snapshot task is alive: a new trigger still makes a snapshot
    hub2.emit(step(100))

    async def again() -> None:
        ev = fault(EventKind.CUDA_ERROR, "log", "after the garbage")
        hub2.emit(ev)
        [o] = c2.opens_for(ev)
        assert o.committed is not None
        await asyncio.wait_for(o.committed, 10)

    asyncio.run(_run(c2, again))
    assert len(repo2.list_snapshots(SnapshotFilter())[0]) == 2


def test_the_capture_reads_what_the_recorder_published_last(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=5.0, late=[step(i) for i in range(3)])

    async def body() -> None:
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "boom"))
        # its commit, not a fixed time (a loaded machine once stopped it after 0.3 s, first)
        deadline = time.monotonic() + 10
        while not committed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    asyncio.run(_run(c, body))
    [row] = repo.list_snapshots(SnapshotFilter())[0]
    assert row["last_step"] == 2 and committed == [row["id"]]


def test_a_disk_full_spool_still_commits_from_memory(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path)
    (tmp_path / "spool").write_text("a file where the spool folder should be")  # writes fail with OSError

    async def body() -> None:
        hub.emit(step(1))
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "boom"))
        await asyncio.sleep(0.3)

    asyncio.run(_run(c, body))
    assert len(committed) == 1


# -- trigger intents: durable before acknowledged, retaken after a kill ---------------------------


def test_the_trigger_is_durable_before_the_policy_returns_and_its_intent_goes_with_the_commit(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path)
    seen: list[list[str]] = []

    async def body() -> None:
        hub.emit(step(1))
        ev = fault(EventKind.XID, "kmsg", "Xid 79", xid=79)
        hub.emit(ev)  # no await since: nothing ran on the loop but the policy
        seen.append([intent.read(p).event.uid for p in intent.pending(tmp_path / "spool")])
        assert seen[0] == [ev.uid]
        for _ in range(50):
            if committed and not intent.pending(tmp_path / "spool"):
                break
            await asyncio.sleep(0.05)

    asyncio.run(_run(c, body))
    assert len(committed) == 1 and not intent.pending(tmp_path / "spool")
    # the trigger's event row is stored with the snapshot, once, whoever wrote it first
    rows = [e for e in repo.list_events() if e["kind"] == "xid"]
    assert len(rows) == 1 and rows[0]["snapshot_id"] == committed[0]


def _left_by_a_kill(tmp_path: Path, ev: Event, accepted_at: float) -> None:
    """What a sidecar killed after accepting ``ev`` and before spooling its snapshot leaves."""
    intent.write(tmp_path / "spool", "decode-0", ev, accepted_at)


def test_an_intent_left_by_a_kill_is_retaken_from_the_rings_with_its_fault_time(migrated_url: str, tmp_path: Path) -> None:
    t0 = time.time() - 30
    ev = Event(
        kind=EventKind.XID,
        ts=t0 + 10,
        source="kmsg",
        message="Xid 79, GPU has fallen off the bus",
        xid=79,
        severity=Severity.CRITICAL,
        uid="feedfacefeedfacefeedfacefeedface",
    )
    _left_by_a_kill(tmp_path, ev, accepted_at=t0 + 10.001)
    (tmp_path / "spool" / "trigger-9.000000-decode-0-torn.intent").write_bytes(intent.MAGIC + b'{"engine"')

    # the new sidecar reads the ring again: steps before the fault, and after it (the engine went on)
    ring = [StepRecord(engine="decode-0", ts=t0 + i * 0.5, step=i, running=3, halves=HALF_STATS) for i in range(30)]
    hub, repo, c, committed = setup(migrated_url, tmp_path, late=ring)

    async def body() -> None:
        for _ in range(50):
            if committed:
                break
            await asyncio.sleep(0.05)

    asyncio.run(_run(c, body))
    [row] = repo.list_snapshots(SnapshotFilter())[0]
    assert committed == [row["id"]] and row["fault_ts"] == pytest.approx(ev.ts) and row["trigger_kind"] == "xid"
    doc = repo.get_snapshot(row["id"])
    # the ring at the fault (and the settle after it), not at the restart
    assert doc.steps[-1]["ts"] <= ev.ts + c.settle_s and doc.steps[-1]["step"] == 20
    assert doc.summary["retaken"]["accepted_at"] == pytest.approx(t0 + 10.001)
    assert [e["uid"] for e in doc.events if e["kind"] == "xid"] == [ev.uid]
    events = [e for e in repo.list_events() if e["kind"] == "xid"]
    assert len(events) == 1 and events[0]["snapshot_id"] == row["id"] and events[0]["xid"] == 79
    assert not intent.pending(tmp_path / "spool")
    assert (tmp_path / "spool" / "trigger-9.000000-decode-0-torn.intent.bad").exists()


def test_a_retaken_trigger_whose_snapshot_was_committed_before_the_kill_is_not_stored_twice(migrated_url: str, tmp_path: Path) -> None:
    """A kill after the commit, before the spool file and the intent were removed."""
    hub, repo, c, committed = setup(migrated_url, tmp_path)
    ev = fault(EventKind.XID, "kmsg", "Xid 43", xid=43)
    kept: dict[str, bytes] = {}
    original = spool.write

    def write_and_keep(*args: Any) -> Path:  # what the killed run left on disk
        path = original(*args)
        kept.setdefault(path.name, path.read_bytes())
        return path

    async def body() -> None:
        hub.emit(step(1))
        hub.emit(ev)
        kept["intent"] = intent.pending(tmp_path / "spool")[0].read_bytes()
        for _ in range(50):
            if committed:
                break
            await asyncio.sleep(0.05)

    spool.write = write_and_keep  # type: ignore[assignment]
    try:
        asyncio.run(_run(c, body))
    finally:
        spool.write = original  # type: ignore[assignment]
    assert len(committed) == 1
    (tmp_path / "spool" / intent.file_name("decode-0", ev)).write_bytes(kept.pop("intent"))
    name, data = next(iter(kept.items()))
    (tmp_path / "spool" / name).write_bytes(data)

    _, repo2, c2, committed2 = setup(migrated_url, tmp_path)  # the restart

    async def again() -> None:
        await asyncio.sleep(0.5)

    asyncio.run(_run(c2, again))
    assert len(repo2.list_snapshots(SnapshotFilter())[0]) == 1
    assert len([e for e in repo2.list_events() if e["kind"] == "xid"]) == 1
    assert not intent.pending(tmp_path / "spool") and not spool.pending(tmp_path / "spool")


def test_at_close_a_memory_only_snapshot_with_the_database_down_is_reported_lost(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'f.db'}"
    (tmp_path / "db").mkdir()  # no tables: every commit fails
    hub, repo, c, committed = setup(url, tmp_path)
    original = spool.write

    def disk_full(*args: Any) -> Path:
        raise OSError(28, "No space left on device")

    lost: list[str] = []

    async def body() -> None:
        hub.emit(step(1))
        hub.emit(fault(EventKind.CUDA_ERROR, "log", "CUDA error: an illegal memory access"))
        await asyncio.sleep(0.3)
        await c.drain(timeout=2)
        lost.extend(await c.close(timeout=2))

    spool.write = disk_full  # type: ignore[assignment]
    try:
        asyncio.run(_run(c, body))
    finally:
        spool.write = original  # type: ignore[assignment]
    assert not committed and len(lost) == 1
    assert lost[0].startswith("engine decode-0, trigger cuda_error at ") and "illegal memory access" in lost[0]
    assert len(intent.pending(tmp_path / "spool")) == 1  # its trigger survives for the next start


def test_the_drain_commits_the_amendment_not_due_yet(migrated_url: str, tmp_path: Path) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=30.0)

    async def body() -> None:
        hub.emit(step(1))
        hub.emit(fault(EventKind.XID, "kmsg", "Xid 43", xid=43))
        for _ in range(50):
            if committed:
                break
            await asyncio.sleep(0.05)
        hub.emit(step(2))  # late evidence
        await c.drain(timeout=5)
        assert await c.close(timeout=2) == []

    asyncio.run(_run(c, body))
    [row] = repo.list_snapshots(SnapshotFilter())[0]
    assert row["last_step"] == 2 and row["summary"].get("amended_at")


def test_the_same_trigger_reported_again_after_a_restart_keeps_its_first_snapshot(migrated_url: str, tmp_path: Path) -> None:
    """A restarted sidecar reads a dead engine's ring again and reports its death with the same
    id: the stored snapshot (with the log lines the first run saw) is neither duplicated nor
    amended by the poorer second capture."""
    death = fault(EventKind.RECORDER_SILENT, "recorder", "recorder channel went silent", uid="silent-of-ring-7")

    def run_once(with_log: bool) -> None:
        hub, repo, c, _ = setup(migrated_url, tmp_path)

        async def body() -> None:
            for i in range(20):
                hub.emit(step(i))
            if with_log:
                hub.emit(LogLine("decode-0", time.time(), "(EngineCore pid=1) ERROR CUDA error: unspecified launch failure"))
            hub.emit(dataclasses.replace(death, data={}))
            await asyncio.sleep(0.8)

        asyncio.run(_run(c, body))

    run_once(with_log=True)
    run_once(with_log=False)
    repo = Repository(make_engine(migrated_url), host="node-a")
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert len(rows) == 1
    doc = repo.get_snapshot(rows[0]["id"])
    assert any("unspecified launch failure" in line["line"] for line in doc.log_lines)


# -- one fault, several snapshots ----------------------------------------------------------------


def test_a_node_wide_xid_makes_every_engines_snapshot_durable_together(migrated_url: str, tmp_path: Path) -> None:
    """An Xid that matches no engine goes to all 8: when the first of its snapshots is durable,
    all are (one transaction), where a serial commit had the 8th durable 1.27 s after it."""
    hub, repo, c, committed = setup(migrated_url, tmp_path, engines=8)
    stored_at_first: list[int] = []
    c.queue.on_committed = (*c.queue.on_committed, lambda doc, ev: stored_at_first.append(repo.snapshot_count()))

    async def body() -> None:
        for e in range(8):
            hub.emit(dataclasses.replace(step(1), engine=f"decode-{e}" if e else "decode-0"))
        hub.emit(Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message="Xid 79", xid=79, gpu="0000:99:00.0", severity=Severity.CRITICAL))
        for _ in range(100):
            if len(committed) == 8:
                break
            await asyncio.sleep(0.05)

    asyncio.run(_run(c, body))
    assert len(committed) == 8 and len({r["engine"] for r in repo.list_snapshots(SnapshotFilter())[0]}) == 8
    assert stored_at_first[0] == 8  # the first commit made all 8 durable
    assert len({r["incident_id"] for r in repo.list_snapshots(SnapshotFilter())[0]}) == 1


def test_a_second_gpus_fault_is_its_own_snapshot_and_the_same_gpu_again_is_late_evidence(migrated_url: str, tmp_path: Path) -> None:
    """A TP engine on GPUs 0 and 1: Xid 43 on GPU 0, then Xid 43 on GPU 1 within the window
    freezes the rings again (its own snapshot, same incident); Xid 43 on GPU 0 again joins."""
    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=5.0)
    buses = {0: "0000:05:00.0", 1: "0000:06:00.0"}

    def xid(gpu: int, msg: str) -> Event:
        return Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message=msg, xid=43, gpu=buses[gpu], severity=Severity.CRITICAL)

    async def body() -> None:
        for i, bus in buses.items():
            hub.emit(GpuSample(gpu=f"GPU-{i}", index=i, ts=time.time(), bus_id=bus, processes=[]))
        hub.intake.engines.ensure("decode-0", gpus=[0, 1])
        for i in range(5):
            hub.emit(step(i))
        hub.emit(xid(0, "Xid 43 on GPU 0"))
        for i in range(5, 8):
            hub.emit(step(i))
        hub.emit(xid(1, "Xid 43 on GPU 1"))
        hub.emit(xid(0, "Xid 43 on GPU 0 again"))
        for _ in range(100):
            if len(committed) == 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)

    asyncio.run(_run(c, body))
    rows = sorted(repo.list_snapshots(SnapshotFilter())[0], key=lambda r: r["id"])
    assert [r["trigger_message"] for r in rows] == ["Xid 43 on GPU 0", "Xid 43 on GPU 1"]
    assert rows[0]["last_step"] == 4 and rows[1]["last_step"] == 7  # each froze the rings at its fault
    assert rows[0]["incident_id"] == rows[1]["incident_id"]
    again = next(e for e in repo.list_events() if e["message"] == "Xid 43 on GPU 0 again")
    assert again["snapshot_id"] in {rows[0]["id"], rows[1]["id"]}  # late evidence, no third snapshot


def test_an_idle_committer_holds_no_capture_of_a_committed_snapshot(migrated_url: str, tmp_path: Path) -> None:
    # a capture holds the engine's request blocks and its job the encoded parts (megabytes at
    # node scale): the queue waiting for the next fault must not keep the last one's
    import gc

    from collector.snapshot.freeze import Capture

    hub, _, c, committed = setup(migrated_url, tmp_path, settle=0.1)
    for i in range(1, 4):
        hub.emit(step(i))

    async def body() -> None:
        ev = Event(kind=EventKind.MANUAL, ts=time.time(), source="api", message="held?", engine="decode-0")
        hub.emit(ev)
        [o] = c.opens_for(ev)
        assert o.committed is not None
        await asyncio.wait_for(o.committed, 5.0)
        for _ in range(100):  # and its amendment, 0.1 s later
            await asyncio.sleep(0.05)
            if o.amended and not c.queue.backlog:
                break
        await asyncio.sleep(0.2)
        gc.collect()
        assert o.amended and committed
        # this snapshot's (the suite's other tests may leave captures of their own behind)
        assert [x for x in gc.get_objects() if type(x) is Capture and x.trigger.uid == ev.uid] == []

    asyncio.run(_run(c, body))
