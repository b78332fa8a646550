"""Database engine creation: SQLite in WAL mode, or Postgres through psycopg 3.

Errors from the driver enter our code here and in ``repo``/``writer`` as ``StorageError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.errors import FlightrecError


class StorageError(FlightrecError):
    """The database is unreachable, hung, or refused a statement.

    ``permanent`` is True when the database refused the statement for its content (a value it
    cannot store, a constraint): retrying the same rows can never succeed, so the caller sets
    them aside instead of holding them forever."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


# A statement that runs longer than this on Postgres is cancelled: a hung database must turn
# into a StorageError within seconds, never a request or a writer that waits forever.
STATEMENT_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_S = 3


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str, **kwargs: Any) -> Engine:
    if is_sqlite(url):
        path = url.split("///", 1)[-1] if "///" in url else ""
        if path and path != ":memory:":
            try:
                Path(path).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
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
            cur.close()

        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_timeout", CONNECT_TIMEOUT_S)
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    given = parsed.query.get("options", "")  # e.g. -csearch_path=...: kept, ours appended
    given = " ".join(given) if isinstance(given, tuple) else given
    options = f"{given} -c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={STATEMENT_TIMEOUT_MS}".strip()
    return create_engine(
        parsed.difference_update_query(["options"]),
        connect_args={
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": options,
            # a peer that stops answering mid-query (SIGSTOP, a dead link) is noticed by TCP
            "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 2,
        },
        **kwargs,
    )


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
