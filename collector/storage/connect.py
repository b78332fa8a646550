"""Connecting to a database: SQLite in WAL mode, or Postgres through psycopg 3 (the SQLAlchemy
engine; ``database.py`` is the store-facing handle built on it).

Errors from the driver enter our code here and in ``repo``/``writer`` as ``StorageError``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import sys
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.errors import FlightrecError
from collector.storage.watchdog import HangWatchdog, watch


class StorageError(FlightrecError):
    """The database is unreachable, hung, or refused a statement.

    ``permanent`` is True when the database refused the statement for its content (a value it
    cannot store, a constraint): retrying the same rows can never succeed, so the caller sets
    them aside instead of holding them forever."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(_plain(message))
        self.permanent = permanent


# SQLAlchemy ends its messages with a link to its own docs and, for a failed statement, the SQL
# and its parameters: neither helps an operator and the parameters may hold row data.
_NOISE = re.compile(r"^\s*(\(Background on this error at: [^)]*\)|\[SQL: |\[parameters: )")


def _plain(message: str) -> str:
    """The message without SQLAlchemy's trailing lines (they come last: cut from the first)."""
    kept: list[str] = []
    for line in message.splitlines():
        if _NOISE.match(line):
            break
        if line.strip():
            kept.append(line.rstrip())
    return "\n".join(kept) or message.strip()


# A statement that runs longer than this on Postgres is cancelled: a hung database must turn
# into a StorageError within seconds, never a request or a writer that waits forever.
STATEMENT_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_S = 3
# A statement with no answer this long after it was sent has its connection cut (watchdog.py):
# above statement_timeout, so only a server that is not running at all is cut.
HUNG_AFTER_S = STATEMENT_TIMEOUT_MS / 1000 + 2

# ``?pool_mode=transaction`` on a Postgres URL: the server is reached through a transaction
# pooler (PgBouncer's pool_mode = transaction). The parameter is ours, taken off the URL.
POOL_MODE = "pool_mode"
TIMEOUTS_PER_TRANSACTION = (
    f"SELECT set_config('statement_timeout', '{STATEMENT_TIMEOUT_MS}', true), set_config('lock_timeout', '{STATEMENT_TIMEOUT_MS}', true)"
)

_WATCHDOGS: weakref.WeakKeyDictionary[Engine, HangWatchdog] = weakref.WeakKeyDictionary()


# SQLite's memory in the sidecar, all connections together: above it, SQLite reuses cache pages
# instead of allocating more (each connection's cache alone may reach 2 MB by default).
SQLITE_HEAP_LIMIT = 8 << 20


def hang_watchdog(engine: Engine) -> HangWatchdog | None:
    """The watchdog of a Postgres engine made by ``make_engine`` (None for SQLite)."""
    return _WATCHDOGS.get(engine)


@functools.cache
def _sqlite_library() -> ctypes.CDLL | None:
    """The SQLite library Python's ``sqlite3`` module runs on, for its process-wide counters;
    None where it cannot be loaded."""
    try:
        import _sqlite3

        lib = ctypes.CDLL(_sqlite3.__file__)
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        lib.sqlite3_memory_used.argtypes = []
    except (ImportError, OSError, AttributeError):
        return None
    return lib


def sqlite_memory() -> int | None:
    """Bytes SQLite holds in this process (every connection's page cache, statements, schema):
    its own count, ``sqlite3_memory_used``. None where unknown. Never raises."""
    if "_sqlite3" not in sys.modules:  # never loaded: SQLite holds nothing here
        return 0
    lib = _sqlite_library()
    if lib is None:
        return None
    try:
        return int(lib.sqlite3_memory_used())
    except (OSError, ValueError):
        return None


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _transaction_pooled(mode: Any) -> bool:
    if mode in (None, "session"):
        return False
    if mode == "transaction":
        return True
    raise StorageError(f"{POOL_MODE}={mode}: use transaction (PgBouncer's pool_mode = transaction) or session; statement pooling breaks transactions")


def make_engine(url: str, **kwargs: Any) -> Engine:
    if is_sqlite(url):
        path = url.split("///", 1)[-1].split("?", 1)[0] if "///" in url else ""
        if path and path != ":memory:":
            try:
                private_file(Path(path).expanduser().resolve())
            except OSError:
                pass  # connecting will fail with a StorageError, which callers handle and retry
        # The newest connection first: each keeps a page cache of its own (up to 2 MB), and a
        # pool handing them out in turn fills every one with the snapshots' blob pages.
        kwargs.setdefault("pool_use_lifo", True)
        engine = create_engine(url, connect_args={"timeout": 5, "check_same_thread": False}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoint; WAL keeps commits
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=5000")
            # process-wide: every connection's page cache together (a pool may hold several)
            cur.execute(f"PRAGMA soft_heap_limit={SQLITE_HEAP_LIMIT}")
            cur.close()

        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_timeout", CONNECT_TIMEOUT_S)
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    pooled = _transaction_pooled(parsed.query.get(POOL_MODE))
    given = parsed.query.get("options", "")  # e.g. -csearch_path=...: kept, ours appended
    given = " ".join(given) if isinstance(given, tuple) else given
    connect_args: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        # a peer that stops answering mid-query (SIGSTOP, a dead link) is noticed by TCP
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
    }
    if pooled:
        # Behind a transaction pooler each transaction may run on another server connection:
        # no prepared statements (psycopg prepares a statement run 5 times, on one connection),
        # and the timeouts set per transaction (PgBouncer refuses a startup ``options``).
        connect_args["prepare_threshold"] = None
        if given:
            connect_args["options"] = given
    else:
        connect_args["options"] = f"{given} -c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={STATEMENT_TIMEOUT_MS}".strip()
    engine = create_engine(parsed.difference_update_query(["options", POOL_MODE]), connect_args=connect_args, **kwargs)
    if pooled:

        @event.listens_for(engine, "begin")
        def _timeouts(conn: Any) -> None:
            conn.exec_driver_sql(TIMEOUTS_PER_TRANSACTION)

    dog = HangWatchdog(HUNG_AFTER_S)
    watch(engine, dog)
    _WATCHDOGS[engine] = dog
    return engine


def private_file(path: Path) -> None:
    """Create the SQLite file owner-only (0600) before SQLite does (it would use 0644 less the
    umask), and the folders it needs 0700. SQLite gives its -wal and -shm files the database
    file's mode, so they are 0600 too. An existing file or folder is left as it is."""
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def translate(exc: SQLAlchemyError) -> StorageError:
    """A driver error as ours: content errors (DataError, IntegrityError) are permanent."""
    from sqlalchemy.exc import DataError, IntegrityError

    permanent = isinstance(exc, (DataError, IntegrityError))
    return StorageError(f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:500]}", permanent=permanent)


def check(engine: Engine) -> None:
    """Raise StorageError if the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except SQLAlchemyError as exc:
        raise StorageError(f"database unreachable: {exc.__class__.__name__}: {exc}") from exc
