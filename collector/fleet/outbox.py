"""The node's rows bound for the shared store, held until the shared store has them.

With a node-local store the outbox is its ``outbox`` table: a batch is one row (its kind and
its rows as JSON), put in one local transaction, taken in order, and deleted only after the
shared store committed it. A shared store that is down or slow costs local disk (a coarse
series is 1.6 rows/s per node, an hour of outage a few MB), never a row, and the outbox
outlives a restart. Shipping is idempotent on the shared side (events by (host, uid, ts), the
series by their keys, engines and GPUs by name), so a batch shipped again after a kill between
the shared commit and the local delete is not stored twice.

Without a node-local store it is a bounded queue in memory (``MemoryOutbox``): what it holds is
lost with the process, and past its bound the oldest batches are dropped and counted.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any, Protocol

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.connect import translate
from collector.storage.models import OutboxRow

Batch = tuple[int, str, list[dict[str, Any]]]  # (id, kind, rows)


class Outbox(Protocol):
    dropped: int

    def put(self, batches: list[tuple[str, list[dict[str, Any]]]]) -> None: ...
    def take(self, limit: int) -> list[Batch]: ...
    def done(self, ids: list[int]) -> None: ...
    def depth(self) -> int: ...


class SqlOutbox:
    """The outbox in the node-local store. Raises StorageError (a full disk: the caller keeps
    the batches in memory and puts them again)."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.dropped = 0

    def put(self, batches: list[tuple[str, list[dict[str, Any]]]]) -> None:
        now = time.time()
        rows = [{"kind": kind, "created_at": now, "payload": json.dumps(items, default=str)} for kind, items in batches if items]
        if not rows:
            return
        try:
            with self.db.begin() as conn:
                conn.execute(insert(OutboxRow), rows)
        except SQLAlchemyError as exc:
            raise translate(exc) from exc

    def take(self, limit: int) -> list[Batch]:
        try:
            with self.db.connect() as conn:
                got = conn.execute(select(OutboxRow.id, OutboxRow.kind, OutboxRow.payload).order_by(OutboxRow.id).limit(limit)).all()
        except SQLAlchemyError as exc:
            raise translate(exc) from exc
        return [(int(r.id), str(r.kind), json.loads(r.payload)) for r in got]

    def done(self, ids: list[int]) -> None:
        if not ids:
            return
        try:
            with self.db.begin() as conn:
                conn.execute(delete(OutboxRow).where(OutboxRow.id.in_(ids)))
        except SQLAlchemyError as exc:
            raise translate(exc) from exc

    def depth(self) -> int:
        try:
            with self.db.connect() as conn:
                return int(conn.execute(select(func.count()).select_from(OutboxRow)).scalar_one())
        except SQLAlchemyError as exc:
            raise translate(exc) from exc


class MemoryOutbox:
    """The outbox without a node-local store: bounded by ``max_batches``."""

    def __init__(self, *, max_batches: int = 20_000) -> None:
        self._q: deque[Batch] = deque()
        self._next = 1
        self.max_batches = max_batches
        self.dropped = 0  # batches dropped by the bound

    def put(self, batches: list[tuple[str, list[dict[str, Any]]]]) -> None:
        for kind, items in batches:
            if not items:
                continue
            self._q.append((self._next, kind, items))
            self._next += 1
            if len(self._q) > self.max_batches:
                self._q.popleft()
                self.dropped += 1

    def take(self, limit: int) -> list[Batch]:
        return [self._q[i] for i in range(min(limit, len(self._q)))]

    def done(self, ids: list[int]) -> None:
        gone = set(ids)
        self._q = deque(b for b in self._q if b[0] not in gone)

    def depth(self) -> int:
        return len(self._q)
