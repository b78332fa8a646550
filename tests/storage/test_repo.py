from __future__ import annotations

import time
from typing import Any

import pytest

from collector.snapshot.document import SnapshotDoc
from collector.storage.connect import StorageError, make_engine
from collector.storage.repo import Repository, SnapshotFilter
from collector.storage.stepchunks import CHUNK_S


def repo(url: str, host: str = "node-a") -> Repository:
    return Repository(make_engine(url), host=host)


def doc(engine: str = "decode-0", *, host: str = "node-a", ts: float | None = None, steps: int = 5, reqs: int = 3) -> SnapshotDoc:
    ts = time.time() if ts is None else ts
    return SnapshotDoc(
        host=host,
        engine=engine,
        created_at=ts,
        fault_ts=ts,
        trigger={"kind": "xid", "source": "kmsg", "message": "NVRM: Xid (PCI:0000:00:06): 43", "xid": 43},
        summary={"running": reqs},
        fingerprint={"block_size": 64},
        steps=[{"step": i, "ts": ts - steps + i, "running": reqs} for i in range(steps)],
        requests=[{"step": i, "request_id": f"r{j}", "prompt_len": 32000} for i in range(steps) for j in range(reqs)],
        events=[{"kind": "xid", "xid": 43}],
        log_lines=[{"ts": ts, "line": "x"}],
    )


def xid_row(**given: Any) -> dict[str, Any]:
    """An Xid event's row as the writer stores it, with ``given`` fields replaced."""
    row: dict[str, Any] = {
        "ts": 1.0,
        "kind": "xid",
        "source": "kmsg",
        "severity": "critical",
        "engine": None,
        "gpu": "0000:00:06.0",
        "xid": 79,
        "pid": None,
        "process": None,
        "message": "Xid 79",
        "data": {},
    }
    return {**row, **given}


def test_snapshot_round_trip(migrated_url: str) -> None:
    r = repo(migrated_url)
    sid, iid = r.store_snapshot(doc(steps=4096, reqs=4), incident_window_s=30, incident_key="k")
    got = r.get_snapshot(sid)
    assert (got.id, got.incident_id, got.engine, got.host) == (sid, iid, "decode-0", "node-a")
    assert len(got.steps) == 4096 and len(got.requests) == 4096 * 4
    assert got.requests[-1] == {"step": 4095, "request_id": "r3", "prompt_len": 32000}
    assert got.fingerprint == {"block_size": 64}
    rows, nxt = r.list_snapshots(SnapshotFilter())
    assert [x["id"] for x in rows] == [sid] and nxt is None
    assert rows[0]["step_count"] == 4096 and rows[0]["request_rows"] == 4096 * 4 and rows[0]["last_step"] == 4095


def test_snapshots_close_in_time_share_an_incident_across_hosts(migrated_url: str) -> None:
    t = time.time()
    a, b = repo(migrated_url, "node-a"), repo(migrated_url, "node-b")
    s1, i1 = a.store_snapshot(doc("decode-0", host="node-a", ts=t), incident_window_s=30, incident_key="k")
    s2, i2 = b.store_snapshot(doc("prefill-0", host="node-b", ts=t + 2), incident_window_s=30, incident_key="k")
    s3, i3 = a.store_snapshot(doc("decode-0", host="node-a", ts=t + 500), incident_window_s=30, incident_key="k")
    assert i1 == i2 != i3
    inc = a.get_incident(i1)
    assert inc["hosts"] == ["node-a", "node-b"] and inc["snapshot_count"] == 2
    assert [s["id"] for s in inc["snapshots"]] == [s1, s2]


def test_batch_write_and_engine_registry(migrated_url: str) -> None:
    r = repo(migrated_url)
    r.register_engine("decode-0", url="http://127.0.0.1:8000", pair="pd-0")
    now = time.time()
    steps = [
        {
            "engine": "decode-0",
            "ts": now + i,
            "step": i,
            "running": 1,
            "waiting": 0,
            "kv_cache_usage": 0.1,
            "preemptions": 0,
            "prompt_tokens": 0,
            "generation_tokens": 1,
            "mirror_rows": None,
        }
        for i in range(1000)
    ]
    gpu = [
        {
            "gpu": "GPU-1",
            "index": 0,
            "bus_id": "0000:00:06.0",
            "name": "H200",
            "ts": now,
            "memory_used": 1,
            "memory_total": 2,
            "utilization": 50.0,
            "temperature": 40.0,
            "power_w": 100.0,
            "sm_clock_mhz": 1980.0,
            "clock_event_reasons": 0,
            "ecc_volatile_uncorrected": 0,
            "remapped_rows_uncorrectable": 0,
            "pcie_replay": 0,
        }
    ]
    events = [xid_row(ts=now, message="fell off the bus", data={"a": 1})]
    r.write_batch(steps, gpu, events, {"decode-0": now})
    assert len(r.recent_steps("decode-0", since=now)) == 1000
    assert r.list_events(kind="xid")[0]["xid"] == 79
    assert r.list_gpus()[0]["bus_id"] == "0000:00:06.0"
    eng = r.list_engines()[0]
    assert (eng["name"], eng["pair"], eng["last_seen"]) == ("decode-0", "pd-0", pytest.approx(now))
    pruned = r.prune(steps_before=now + 500, gpu_before=0, events_before=0, snapshots_before=None)
    # whole chunks go: every step before the horizon but those sharing a chunk with a later one
    assert 500 - CHUNK_S < pruned["engine_steps"] <= 500
    kept = r.recent_steps("decode-0", since=0)
    assert len(kept) == 1000 - pruned["engine_steps"]
    assert min(s["ts"] for s in kept) > now + 500 - CHUNK_S


def test_database_down_is_a_storage_error_not_a_crash() -> None:
    r = repo("postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(StorageError):
        r.list_snapshots(SnapshotFilter())
    with pytest.raises(StorageError):
        r.store_snapshot(doc(), incident_window_s=30, incident_key="k")


def test_linking_an_event_refreshes_the_witnesses_merged_after_it_was_written(migrated_url: str) -> None:
    r = repo(migrated_url)
    sid, _ = r.store_snapshot(doc(), incident_window_s=30, incident_key="k")
    row = {
        "ts": 1.0,
        "kind": "xid",
        "source": "nvml",
        "severity": "warning",
        "engine": None,
        "gpu": "0000:00:06.0",
        "xid": 43,
        "pid": None,
        "process": None,
        "message": "Xid 43",
        "data": {"sources": ["nvml"]},
    }
    r.write_batch([], [], [row])
    assert r.link_event(row, sid) == 1
    assert r.link_event(dict(row, data={"sources": ["nvml", "kmsg"]}), sid) == 1  # the amendment's pass
    (stored,) = r.list_events(kind="xid")
    assert stored["snapshot_id"] == sid and stored["data"]["sources"] == ["nvml", "kmsg"]


def test_one_event_stored_by_two_transactions_at_once_is_one_row(migrated_url: str) -> None:
    """An Xid read again after a restart is the same event (its id from its place in the kernel
    log) with another reading time: the writer's batch and a snapshot's link may store it at
    once. The second waits for the first's row and takes its time: one row, linked."""
    import threading

    from collector.storage.database import nul_free
    from collector.storage.events import stored_event_times
    from collector.storage.models import EventRow

    r = repo(migrated_url)
    sid, _ = r.store_snapshot(doc(), incident_window_s=30, incident_key="k")
    first = xid_row(uid="xid-at-4711", ts=1.0, message="Xid 79", data={"sources": ["kmsg"]})
    again = dict(first, ts=2.0)
    db = r.database
    with db.tx() as conn:  # the writer's batch, between its look and its insert
        rows = stored_event_times(conn, db.host, [nul_free(dict(first, host=db.host))])
        link = threading.Thread(target=r.link_event, args=(again, sid))
        link.start()
        link.join(0.5)
        assert link.is_alive(), "the link looked before the batch's row was in"
        conn.execute(db.insert_ignore(EventRow, ["host", "uid", "ts"]), rows)
    link.join(10)
    stored = [e for e in r.list_events(kind="xid") if e["uid"] == first["uid"]]
    assert [(e["ts"], e["snapshot_id"]) for e in stored] == [(1.0, sid)]
