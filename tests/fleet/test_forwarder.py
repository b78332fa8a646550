"""The forwarder as the kernel log's barrier: an event counts as written once it is durable, in
the node-local outbox, or (without a node-local store) once the shared store has it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector.fleet.forwarder import FleetRows
from collector.fleet.outbox import MemoryOutbox, SqlOutbox
from collector.model import Event, EventKind, Severity
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository


def xid(uid: str) -> Event:
    return Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message="Xid 43", severity=Severity.CRITICAL, xid=43, uid=uid)


def test_an_event_in_the_local_outbox_has_passed_though_the_shared_store_is_down(tmp_path: Path) -> None:
    local = f"sqlite:///{tmp_path / 'node.db'}"
    upgrade(local)
    (tmp_path / "blocker").write_text("")  # the shared store's folder is a file: it cannot be reached
    shared = Repository(make_engine(f"sqlite:///{tmp_path / 'blocker' / 'shared.db'}"), host="node-a")
    rows = FleetRows(shared=shared, outbox=SqlOutbox(make_engine(local)), local=None, host="node-a")
    rows.offer_event(xid("e1"))
    ticket = rows.ticket()
    assert ticket == 1 and not rows.passed(ticket)
    asyncio.run(rows.flush())
    assert rows.passed(ticket) and rows.shared_up is False and rows.backlog == 1


def test_without_a_local_store_an_event_passes_once_shipped(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    shared_url = f"sqlite:///{tmp_path / 'shared.db'}"
    down = Repository(make_engine(f"sqlite:///{tmp_path / 'blocker' / 'shared.db'}"), host="node-a")
    rows = FleetRows(shared=down, outbox=MemoryOutbox(), local=None, host="node-a")
    rows.offer_event(xid("e1"))
    ticket = rows.ticket()
    asyncio.run(rows.flush())
    assert not rows.passed(ticket)  # held in memory only
    upgrade(shared_url)
    rows.shared = Repository(make_engine(shared_url), host="node-a")
    asyncio.run(rows.flush())
    assert rows.passed(ticket) and rows.shared_up is True and rows.backlog == 0
