"""A hung Postgres cannot wedge a caller: every statement (and pool ping, commit, rollback) is
watched, and one that has no answer ``after_s`` seconds after it was sent has its socket shut,
so the driver raises at once and the connection is thrown away.

Why the server's own timeouts are not enough: ``statement_timeout`` is enforced by the server,
and a server that is stopped (SIGSTOP, a frozen VM, a wedged storage layer) enforces nothing;
TCP keepalives do not fire either, because the stopped server's kernel still acknowledges
every probe. Without this, a write, a snapshot commit or an API read would wait as long as the
server is stopped, holding a worker thread, while /healthz would still say the database is up.

``after_s`` is above the server's ``statement_timeout``: a live server cancels its own slow
statement first, so only a silent one is cut here. The thread runs while statements come and
ends after 30 s with none in flight.
One case stays in doubt: a COMMIT cut after it was sent may still be applied when the server
resumes; the writer's step rows are insert-or-ignore, so writing them again adds nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

IDLE_EXIT_S = 30.0  # the thread ends after this long with nothing in flight (and starts again on the next)


class HangWatchdog:
    def __init__(self, after_s: float, *, tick_s: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self.tick_s = tick_s
        self.clock = clock
        self._armed: dict[int, tuple[float, int]] = {}  # key -> (sent at, socket fd)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.shut = 0  # statements cut for want of an answer
        self.last_shut: float | None = None  # epoch seconds

    def arm(self, key: int, fd: int) -> None:
        with self._lock:
            self._armed[key] = (self.clock(), fd)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="db-hang-watchdog", daemon=True)
                self._thread.start()

    def disarm(self, key: int) -> None:
        with self._lock:
            self._armed.pop(key, None)

    def oldest_wait_s(self) -> float | None:
        """How long the oldest statement in flight has waited (None: none in flight)."""
        with self._lock:
            if not self._armed:
                return None
            return self.clock() - min(t for t, _ in self._armed.values())

    def check(self) -> int:
        """Shut the sockets of the statements overdue now; returns how many."""
        now = self.clock()
        cut = 0
        with self._lock:  # held while shutting: a disarmed statement's fd may be closed and reused
            for key, (sent, fd) in list(self._armed.items()):
                if now - sent < self.after_s:
                    continue
                del self._armed[key]
                # counted before the shutdown: whoever the cut wakes sees it counted
                before = self.last_shut
                self.shut += 1
                self.last_shut = time.time()
                try:
                    dup = socket.socket(fileno=os.dup(fd))
                    try:
                        dup.shutdown(socket.SHUT_RDWR)  # the shared socket: the driver's poll wakes with EOF
                    finally:
                        dup.close()
                except OSError:
                    self.shut -= 1
                    self.last_shut = before
                    continue
                cut += 1
        if cut:
            log.error("the database did not answer %d statement(s) for %.0fs: connection(s) cut", cut, self.after_s)
        return cut

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            time.sleep(self.tick_s)
            self.check()
            with self._lock:
                if self._armed:
                    idle_since = None
                    continue
                idle_since = idle_since if idle_since is not None else time.monotonic()
                if time.monotonic() - idle_since > IDLE_EXIT_S:  # a quiet engine costs no thread
                    self._thread = None
                    return


def socket_of(dbapi_obj: Any) -> int | None:
    """The socket of a psycopg 3 connection or cursor (None when it has none)."""
    obj, pgconn = dbapi_obj, None
    for _ in range(3):  # a cursor -> its connection; the pool's wrapper -> the driver's connection
        pgconn = getattr(obj, "pgconn", None)
        if pgconn is not None or obj is None:
            break
        obj = getattr(obj, "driver_connection", None) or getattr(obj, "connection", None)
    try:
        fd = pgconn.socket if pgconn is not None else None
    except Exception:  # a closed connection has no socket
        return None
    return int(fd) if isinstance(fd, int) else None


def watch(engine: Any, dog: HangWatchdog) -> None:
    """Arm ``dog`` around every statement, ping, commit and rollback of ``engine``."""
    from sqlalchemy import event

    @event.listens_for(engine, "before_cursor_execute")
    def _before(_conn: Any, cursor: Any, *_args: Any) -> None:
        fd = socket_of(cursor)
        if fd is not None:
            dog.arm(id(cursor), fd)

    @event.listens_for(engine, "after_cursor_execute")
    def _after(_conn: Any, cursor: Any, *_args: Any) -> None:
        dog.disarm(id(cursor))

    @event.listens_for(engine, "handle_error")
    def _error(ctx: Any) -> None:
        cursor = getattr(ctx, "cursor", None)  # none when connecting failed
        if cursor is not None:
            dog.disarm(id(cursor))

    dialect = engine.dialect
    for name in ("do_ping", "do_commit", "do_rollback"):
        setattr(dialect, name, _watched(dog, getattr(dialect, name)))


def _watched(dog: HangWatchdog, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(dbapi_connection: Any) -> Any:
        fd = socket_of(dbapi_connection)
        if fd is None:
            return call(dbapi_connection)
        key = id(dbapi_connection) ^ 1  # apart from any cursor's key
        dog.arm(key, fd)
        try:
            return call(dbapi_connection)
        finally:
            dog.disarm(key)

    return run
