"""The forwarder as the kernel log's barrier: an event counts as written once it is durable, in
the node-local outbox, or (without a node-local store) once the shared store has it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from collector.columns import batch_from_rows
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


def test_rounds_never_overlap_and_the_last_round_ships_every_step(tmp_path: Path) -> None:
    """The stop's last round (``everything``) comes while a periodic round is in its thread: it
    waits for it, so the coarse series is never read and written by two rounds at once, and every
    step is counted once in the shared store."""
    shared_url = f"sqlite:///{tmp_path / 'shared.db'}"
    upgrade(shared_url)
    rows = FleetRows(shared=Repository(make_engine(shared_url), host="node-a"), outbox=MemoryOutbox(), local=None, host="node-a", interval_s=1.0)
    inside, most = 0, 0
    real_round = rows._round

    def slow_round(*args: Any) -> bool:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            time.sleep(0.2)  # a shared store that answers slowly
            return real_round(*args)
        finally:
            inside -= 1

    rows._round = slow_round  # type: ignore[method-assign,assignment]
    now = time.time()
    sent = 0

    def offer(n: int) -> None:
        nonlocal sent
        rows.offer_steps(batch_from_rows("decode-0", [{"ts": now - 5 + 0.01 * (sent + i), "step": sent + i, "run": 0} for i in range(n)]))
        sent += n

    async def scenario() -> None:
        offer(300)
        periodic = asyncio.create_task(rows.flush())
        await asyncio.sleep(0.05)  # the periodic round is in its thread
        offer(200)
        await rows.flush(everything=True)
        await periodic

    asyncio.run(scenario())
    assert most == 1
    db = make_engine(shared_url)
    with db.connect() as conn:
        assert conn.execute(text("SELECT SUM(steps) FROM engine_series")).scalar_one() == sent
