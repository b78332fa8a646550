"""The shared store behind PgBouncer in transaction mode (Debian's ``pgbouncer``, started here
on a free port in front of the real Postgres), as docs/fleet.md has 1,000 nodes reach it: the
migrations, many nodes' outbox shipping and a fault storm's snapshots through a few server
connections, one incident for the storm, and the fleet view's reads. The URL says
``?pool_mode=transaction``: no prepared statements (a pooled connection is not the one that
prepared them), the statement and lock timeouts set per transaction."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from collector.fleet.forwarder import FleetRows
from collector.fleet.outbox import MemoryOutbox
from collector.fleet.queries import FleetFilter, crash_groups
from collector.model import Event, EventKind, Severity
from collector.storage.connect import StorageError, make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository
from tests.conftest import PG_URL
from tests.fleet.crashes import crash_doc
from tests.support.pgbouncer import LocalPgBouncer, find_binary

pytestmark = [pytest.mark.postgres, pytest.mark.skipif(find_binary() is None, reason="needs Debian's pgbouncer (scripts/install-test-deps.sh)")]

NODES = 16
SERVER_POOL = 3  # PgBouncer's server connections for the database: far fewer than the nodes


@pytest.fixture
def bouncer() -> Iterator[tuple[LocalPgBouncer, str]]:
    """A database of its own on the real Postgres (a schema would need a startup ``options``,
    which PgBouncer refuses) and a PgBouncer in front of it: (PgBouncer, its URL)."""
    name = f"flightrec_pgb_{uuid.uuid4().hex[:10]}"
    admin = make_url(PG_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        with LocalPgBouncer(PG_URL, pool_size=SERVER_POOL) as b:
            yield b, b.url(PG_URL, database=name)
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _xid(uid: str, ts: float) -> Event:
    return Event(kind=EventKind.XID, ts=ts, source="kmsg", message="Xid 79", severity=Severity.CRITICAL, xid=79, uid=uid)


def test_a_fleet_through_pgbouncer_in_transaction_mode(bouncer: tuple[LocalPgBouncer, str]) -> None:
    b, url = bouncer
    database = str(make_url(url).database)
    upgrade(url)  # Alembic through the pooler
    nodes = [Repository(make_engine(url, pool_size=1, max_overflow=1), host=f"node-{i:02d}") for i in range(NODES)]
    t = time.time()

    def node(i: int) -> tuple[int, int]:
        r = nodes[i]
        rows = FleetRows(shared=r, outbox=MemoryOutbox(), local=None, host=r.host)
        for k in range(8):  # the same statements again and again: psycopg would prepare them from the 5th
            rows.offer_event(_xid(f"{r.host}-e{k}", t - 60 + k))
            asyncio.run(rows.flush())
        assert rows.backlog == 0 and rows.shared_up
        doc = crash_doc(r.host, "decode-0", t + i * 0.4, xid=79, gpu="0000:18:00.0", cuda=False)
        return r.store_snapshot(doc, incident_window_s=30, incident_key=f"{r.host}/decode-0")

    peak = 0
    with ThreadPoolExecutor(NODES) as pool:
        futures = [pool.submit(node, i) for i in range(NODES)]
        while not all(f.done() for f in futures):
            peak = max(peak, b.server_connections(database))
            time.sleep(0.02)
        stored = [f.result() for f in futures]
    assert 0 < peak <= SERVER_POOL  # 16 nodes' clients, at most 3 server connections
    (incident,) = {iid for _, iid in stored}
    inc = nodes[0].get_incident(incident)
    assert inc["snapshot_count"] == NODES and inc["hosts"] == [f"node-{i:02d}" for i in range(NODES)]
    assert nodes[0].snapshot_count() == NODES
    events = nodes[0].list_events(limit=1000)
    assert sorted(e["uid"] for e in events) == sorted(f"node-{i:02d}-e{k}" for i in range(NODES) for k in range(8))  # each once
    (group,) = crash_groups(nodes[0].db, FleetFilter())
    assert (group["occurrences"], group["snapshots"], len(group["hosts"])) == (1, NODES, NODES)  # the storm is one occurrence
    with nodes[0].db.begin() as conn:  # the timeouts hold through the pooler, per transaction
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "5s"
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "5s"
    for r in nodes:
        r.db.dispose()


def test_a_url_without_the_pool_mode_is_refused_by_pgbouncer_with_a_clear_error(bouncer: tuple[LocalPgBouncer, str]) -> None:
    _b, url = bouncer
    plain = make_url(url).difference_update_query(["pool_mode"]).render_as_string(hide_password=False)
    with pytest.raises(StorageError, match="unsupported startup parameter: options"):
        Repository(make_engine(plain), host="node-a").snapshot_count()
    with pytest.raises(StorageError, match="pool_mode=statement: use transaction"):
        make_engine(plain + "?pool_mode=statement")


def test_the_pgbouncer_started_here_is_gone_after_stop() -> None:
    with LocalPgBouncer(PG_URL) as b:
        assert b.proc is not None
        pid = b.proc.pid
        assert b.admin("SHOW VERSION")
    assert not Path(f"/proc/{pid}").exists()
