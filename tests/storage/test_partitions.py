"""Time partitions on the real Postgres: events and the coarse series are partitioned after
0004, partitions are made ahead and dropped for retention (no DELETE), a row outside them lands
in the DEFAULT partition and moves into the partition made for its span, and on SQLite nothing
of this applies."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from collector.storage import partitions
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade

DAY = 86400.0
EVENT = (
    "INSERT INTO events (uid, ts, host, kind, source, severity, message, data{link}) "
    "VALUES (:u, :ts, 'a', 'xid', 'kmsg', 'critical', 'm', '{{}}'{val})"
)


def names(db: object, table: str) -> list[str]:
    with db.connect() as conn:  # type: ignore[attr-defined]
        return [p.name for p in partitions.partitions(conn, table)]


@pytest.mark.postgres
def test_events_and_series_are_partitioned_with_partitions_ahead(pg_url: str) -> None:
    upgrade(pg_url)
    db = make_engine(pg_url)
    today = partitions.partition_name("events", partitions.span_start(time.time(), DAY))
    with db.connect() as conn:
        for table in partitions.PARTITIONED:
            assert partitions.is_partitioned(conn, table)
    got = names(db, "events")
    assert today in got and "events_default" in got and len(got) >= 4  # today, two days ahead, default
    db.dispose()


@pytest.mark.postgres
def test_0004_keeps_the_events_rows_ids_and_links(pg_url: str) -> None:
    upgrade(pg_url, "0003")
    db = make_engine(pg_url)
    old = time.time() - 3 * DAY
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO incidents (key, title, opened_at, updated_at, trigger_kind, hosts, engines, snapshot_count) "
                "VALUES ('k','t',1,1,'xid','[]','[]',1)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO snapshots (incident_id, host, engine, created_at, fault_ts, trigger_kind, trigger_source, trigger_message, "
                "step_count, request_rows, summary, fingerprint) VALUES (1,'a','e',1,1,'xid','kmsg','m',0,0,'{}','{}')"
            )
        )
        for i, ts in enumerate((old, time.time())):
            conn.execute(text(EVENT.format(link=", snapshot_id", val=", 1")), {"u": f"u{i}", "ts": ts})
        before = conn.execute(text("SELECT id, uid, snapshot_id FROM events ORDER BY id")).all()
    upgrade(pg_url)
    with db.begin() as conn:
        after = conn.execute(text("SELECT id, uid, snapshot_id FROM events ORDER BY id")).all()
        assert after == before
        # the old row's day got a partition of its own, not the DEFAULT one
        assert conn.execute(text("SELECT COUNT(*) FROM events_default")).scalar_one() == 0
        new_id = conn.execute(text(EVENT.format(link="", val="") + " RETURNING id"), {"u": "u9", "ts": time.time()}).scalar_one()
        assert new_id > max(r.id for r in before)  # the id sequence carried over
    assert partitions.partition_name("events", partitions.span_start(old, DAY)) in names(db, "events")
    db.dispose()


@pytest.mark.postgres
def test_retention_drops_partitions_and_a_late_row_moves_out_of_the_default(pg_url: str) -> None:
    upgrade(pg_url)
    db = make_engine(pg_url)
    now = time.time()
    far = now - 40 * DAY  # older than any partition: the DEFAULT partition takes it
    with db.begin() as conn:
        conn.execute(text(EVENT.format(link="", val="")), {"u": "late", "ts": far})
        assert conn.execute(text("SELECT COUNT(*) FROM events_default")).scalar_one() == 1
        made = partitions.ensure(conn, "events", now=now, span_s=DAY, since=far)
    assert partitions.partition_name("events", partitions.span_start(far, DAY)) in made
    with db.begin() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM events_default")).scalar_one() == 0
        assert conn.execute(text("SELECT COUNT(*) FROM events WHERE uid = 'late'")).scalar_one() == 1
    out = partitions.maintain(db, span_s=DAY, keep_s={t: 30 * DAY for t in partitions.PARTITIONED}, now=now)
    dropped = out["events"]["dropped"]
    assert partitions.partition_name("events", partitions.span_start(far, DAY)) in dropped
    assert all(n.startswith("events_p") for n in dropped)
    with db.begin() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM events WHERE uid = 'late'")).scalar_one() == 0
    # again: nothing to do, nothing locked
    again = partitions.maintain(db, span_s=DAY, keep_s={t: 30 * DAY for t in partitions.PARTITIONED}, now=now)
    assert all(v == {"created": [], "dropped": []} for v in again.values())
    # hourly spans from here on: ahead of the daily ones already made, none overlapping them
    hourly = partitions.maintain(db, span_s=3600, keep_s={}, now=now + 3 * DAY)
    assert hourly["events"]["created"] and all(n.startswith("events_p") for n in hourly["events"]["created"])
    db.dispose()


def test_sqlite_has_no_partitions(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    db = make_engine(sqlite_url)
    assert partitions.maintain(db, span_s=DAY, keep_s={"events": DAY}) == {}
    db.dispose()


def test_an_event_read_again_at_another_time_is_one_row(migrated_url: str) -> None:
    """Events' unique key holds ts (the partition key on Postgres); a kernel record read again
    after a restart keeps its id but not its reading time, and is still one row, linked."""
    from collector.storage.repo import Repository

    repo = Repository(make_engine(migrated_url), host="node-a")
    ev = {"uid": "k1", "ts": time.time(), "kind": "xid", "source": "kmsg", "severity": "critical", "message": "Xid 43", "data": {}}
    repo.write_batch([], [], [ev], None)
    repo.write_batch([], [], [dict(ev, ts=ev["ts"] + 5.0)], None)
    with repo.db.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM events WHERE uid = 'k1'")).scalar_one() == 1
    repo.db.dispose()
