"""One database as the stores use it: its SQLAlchemy engine, this node's name, and one
transaction at a time whose driver errors become ``StorageError``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.connect import StorageError, translate


class NotFound(StorageError):
    pass


def nul_free(value: Any) -> Any:
    """Postgres text and JSONB cannot hold NUL: a NUL byte in a log line or a reason would make
    the whole batch fail forever. Replaced, everywhere a string is kept in a column."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {nul_free(k): nul_free(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nul_free(v) for v in value]
    return value


class Database:
    def __init__(self, db: Engine, *, host: str) -> None:
        self.db = db  # the SQLAlchemy engine (named so beside vLLM's engines)
        self.host = host
        # ids of this host's engines and GPUs, learnt inside transactions
        self.engine_ids: dict[str, int] = {}
        self.gpu_ids: dict[str, int] = {}

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        try:
            with self.db.begin() as conn:
                yield conn
        except NotFound:
            raise
        except SQLAlchemyError as exc:
            # ids learnt inside a transaction that rolled back may not exist: forget them all
            self.engine_ids.clear()
            self.gpu_ids.clear()
            raise translate(exc) from exc

    @property
    def dialect(self) -> str:
        return self.db.dialect.name

    @property
    def param_mark(self) -> str:
        """The driver's parameter mark, for statements written in its own form (``%s`` for
        psycopg, ``?`` for sqlite3)."""
        return "%s" if self.db.dialect.paramstyle in ("format", "pyformat") else "?"

    def insert_ignore(self, table: Any, keys: list[str]) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table).on_conflict_do_nothing(index_elements=keys)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing(index_elements=keys)
