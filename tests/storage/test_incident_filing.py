"""A fault storm on one Postgres: each node's snapshot and its parts go in beside the others',
and only the filing under an incident takes the store-wide lock, so that nodes' snapshots of one
fault still join one incident."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from collector.storage.repo import Repository
from collector.storage.snapshots import INCIDENT_LOCK, SnapshotCommit
from tests.storage.test_repo import doc, repo

pytestmark = pytest.mark.postgres


def _commit(r: Repository, engine: str, ts: float, uid: str) -> tuple[int, int]:
    d = doc(engine, host=r.host, ts=ts, steps=256, reqs=4)
    [(sid, stored)] = r.commit_snapshots([SnapshotCommit(d, "k", trigger_uid=uid)], incident_window_s=30)
    assert stored
    return sid, int(d.incident_id or 0)


def _libpq(url: str) -> tuple[str, str]:
    """The psycopg URL and the search_path the fixture's schema sets."""
    u = make_url(url)
    options = str(u.query.get("options", ""))
    return u.set(drivername="postgresql").difference_update_query(["options"]).render_as_string(hide_password=False), options


def test_a_storm_of_concurrent_commits_files_one_incident_per_fault(pg_url: str) -> None:
    from collector.storage.migrate import upgrade

    upgrade(pg_url)
    nodes = [repo(pg_url, f"node-{i:02d}") for i in range(16)]
    t = time.time()
    start = threading.Barrier(len(nodes))

    def storm(i: int, r: Repository) -> tuple[int, int]:
        start.wait()  # all at once: the filing is what keeps them one incident
        return _commit(r, "decode-0", t + i * 0.5, "storm-1")

    with ThreadPoolExecutor(len(nodes)) as pool:
        first = list(pool.map(storm, range(len(nodes)), nodes))
        start.reset()
        second = list(pool.map(lambda i, r: (start.wait(), _commit(r, "decode-0", t + 600 + i * 0.5, "storm-2"))[1], range(len(nodes)), nodes))
    (a,) = {iid for _, iid in first}
    (b,) = {iid for _, iid in second}
    assert a != b
    for incident, snaps in ((a, first), (b, second)):
        inc = nodes[0].get_incident(incident)
        assert inc["snapshot_count"] == len(nodes)
        assert inc["hosts"] == [f"node-{i:02d}" for i in range(len(nodes))]
        assert sorted(s["id"] for s in inc["snapshots"]) == sorted(sid for sid, _ in snaps)
    for r in nodes:
        r.db.dispose()


def _hold_the_lock(pg_url: str) -> psycopg.Connection[Any]:
    url, options = _libpq(pg_url)
    holder = psycopg.connect(url, options=options, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (INCIDENT_LOCK,))
    return holder


def _waiting_filer(holder: psycopg.Connection[Any]) -> bool:
    row = holder.execute(
        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s", (INCIDENT_LOCK & 0xFFFFFFFF,)
    ).fetchone()
    return row is not None


def _stored(holder: psycopg.Connection[Any], uid: str) -> list[tuple[Any, ...]]:
    return list(holder.execute("SELECT id, incident_id FROM snapshots WHERE trigger_uid = %s", (uid,)).fetchall())


def test_the_parts_are_committed_before_the_store_wide_lock(pg_url: str) -> None:
    """While another filer holds the lock, a node's snapshot and parts are already committed
    (seen from another connection, unfiled) and only its filing waits; an amendment (no
    filing) does not wait at all."""
    from collector.storage.migrate import upgrade

    upgrade(pg_url)
    a, b = repo(pg_url, "node-a"), repo(pg_url, "node-b")
    amended, _ = _commit(b, "decode-0", time.time(), "earlier")
    holder = _hold_the_lock(pg_url)
    result: list[tuple[int, int]] = []
    waiter = threading.Thread(target=lambda: result.append(_commit(a, "decode-0", time.time(), "late")))
    waiter.start()
    try:
        for _ in range(100):
            if _waiting_filer(holder):
                break
            time.sleep(0.05)
        ((sid, incident),) = _stored(holder, "late")
        assert incident is None and not result  # committed, waiting only to be filed
        parts = holder.execute("SELECT count(*) FROM snapshot_parts WHERE snapshot_id = %s", (sid,)).fetchone()
        assert parts is not None and parts[0] >= 5
        b.amend_snapshot(amended, doc("decode-0", host="node-b", steps=300))  # no filing: no wait
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", (INCIDENT_LOCK,))
        holder.close()
    waiter.join(10)
    assert len(result) == 1 and result[0][0] == sid and result[0][1] > 0
    assert a.get_snapshot(sid).incident_id == result[0][1]
    assert len(b.get_snapshot(amended).steps) == 300
    a.db.dispose()
    b.db.dispose()


@pytest.mark.slow
def test_a_filing_that_times_out_is_done_by_the_retry(pg_url: str) -> None:
    """The lock not had within the lock timeout: the commit fails (the queue retries it), the
    snapshot stays stored once, and the retry files it and says it is stored now."""
    from collector.model import Event, EventKind, Severity
    from collector.storage.connect import StorageError
    from collector.storage.migrate import upgrade
    from collector.storage.writer import event_row

    upgrade(pg_url)
    a = repo(pg_url, "node-a")
    t = time.time()
    ev = event_row(Event(kind=EventKind.XID, ts=t, source="kmsg", message="Xid 79", severity=Severity.CRITICAL, xid=79, uid="xid-1"))
    item = SnapshotCommit(doc("decode-0", host="node-a", ts=t), "k", trigger_uid="xid-1", events=[ev])
    holder = _hold_the_lock(pg_url)
    try:
        with pytest.raises(StorageError, match="lock timeout|statement timeout"):
            a.commit_snapshots([item], incident_window_s=30)
        ((sid, incident),) = _stored(holder, "xid-1")
        assert incident is None
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", (INCIDENT_LOCK,))
        holder.close()
    again = SnapshotCommit(doc("decode-0", host="node-a", ts=t), "k", trigger_uid="xid-1", events=[ev])
    assert a.commit_snapshots([again], incident_window_s=30) == [(sid, True)]
    assert again.doc.incident_id and a.get_snapshot(sid).incident_id == again.doc.incident_id
    assert a.get_incident(again.doc.incident_id)["snapshot_count"] == 1
    assert a.snapshot_count() == 1
    third = SnapshotCommit(doc("decode-0", host="node-a", ts=t), "k", trigger_uid="xid-1", events=[ev])
    assert a.commit_snapshots([third], incident_window_s=30) == [(sid, False)]  # filed: a retake is a duplicate
    assert len([e for e in a.list_events(limit=100) if e["uid"] == "xid-1"]) == 1
    a.db.dispose()


def _filed(url: str, faults: list[tuple[str, str, float]]) -> tuple[list[int], list[tuple[Any, ...]]]:
    """The faults committed one by one: for each snapshot the first snapshot of its incident,
    and each incident's span, hosts, engines and count (keyed the same way)."""
    from collector.storage.migrate import upgrade

    upgrade(url)
    nodes: dict[str, Repository] = {}
    incident_of: list[int] = []
    for i, (host, engine, ts) in enumerate(faults):
        r = nodes.setdefault(host, repo(url, host))
        incident_of.append(_commit(r, engine, ts, f"f{i}")[1])
    first = {iid: incident_of.index(iid) for iid in incident_of}
    r = next(iter(nodes.values()))
    shapes = []
    for iid in sorted(first, key=first.__getitem__):
        inc = r.get_incident(iid)
        shapes.append((first[iid], inc["opened_at"], inc["updated_at"], inc["hosts"], inc["engines"], inc["snapshot_count"], inc["title"]))
    for n in nodes.values():
        n.db.dispose()
    return [first[i] for i in incident_of], shapes


def test_postgres_files_in_one_statement_exactly_as_the_rule_does(pg_url: str, sqlite_url: str) -> None:
    """The same faults, committed in the same (late, shuffled) order: Postgres's one-statement
    filing groups them exactly as the rule in Python does on SQLite."""
    rng = random.Random(7)
    t = 1_796_000_000.0
    centres = [0.0, 20.0, 45.0, 100.0, 400.0, 431.0]
    hosts = ["node-B", "node-a", "node_c", "Node-d", "node-e"]  # mixed case and punctuation: the sort order
    faults = [(rng.choice(hosts), rng.choice(["decode-0", "prefill-0"]), t + rng.choice(centres) + rng.uniform(-15, 15)) for _ in range(60)]
    on_pg, on_sqlite = _filed(pg_url, faults), _filed(sqlite_url, faults)
    assert on_pg == on_sqlite
    assert 3 <= len(on_pg[1]) < 60  # faults joined, and several incidents
