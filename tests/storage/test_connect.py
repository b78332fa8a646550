"""Connecting to SQLite: SQLite's own memory count read, and its process-wide limit set on every
connection."""

from __future__ import annotations

import subprocess
import sys

from sqlalchemy import text

from collector.storage.connect import SQLITE_HEAP_LIMIT, make_engine, sqlite_memory


def test_sqlites_memory_is_counted_and_grows_with_a_connections_cache(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x BLOB)"))
        conn.execute(text("INSERT INTO t VALUES (:x)"), [{"x": b"\x01" * 4000} for _ in range(300)])
    before = sqlite_memory()
    assert before is not None and before > 0
    with engine.connect() as conn:
        assert conn.execute(text("SELECT sum(length(x)) FROM t")).scalar() == 1_200_000
        assert conn.execute(text("PRAGMA soft_heap_limit")).scalar() == SQLITE_HEAP_LIMIT
    after = sqlite_memory()
    assert after is not None and after > before  # the pages read sit in the connection's cache
    engine.dispose()


def test_a_process_that_never_loaded_sqlite_holds_nothing_in_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from collector.storage.connect import sqlite_memory; import sys; print(sqlite_memory(), '_sqlite3' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["0", "False"]


_MANY = """
import sys
from sqlalchemy import text
from collector.storage.connect import SQLITE_HEAP_LIMIT, make_engine, sqlite_memory
engine = make_engine(f"sqlite:///{sys.argv[1]}", pool_size=12, max_overflow=0)
with engine.begin() as conn:
    conn.execute(text("CREATE TABLE t (x BLOB)"))
    conn.execute(text("INSERT INTO t VALUES (:x)"), [{"x": bytes([i % 251]) * 4000} for i in range(1500)])
held = [engine.connect() for _ in range(12)]
for conn in held:
    assert conn.execute(text("SELECT count(*) FROM t WHERE length(x) = 4000")).scalar() == 1500
print(sqlite_memory(), SQLITE_HEAP_LIMIT)
"""


def test_the_limit_bounds_sqlites_memory_over_many_connections(tmp_path) -> None:
    # SQLite's count is the process's: a fresh interpreter holds only these connections
    # twelve connections each reading 6 MB: 2 MB of cache each without a limit, 24 MB in all
    out = subprocess.run([sys.executable, "-c", _MANY, str(tmp_path / "m.db")], capture_output=True, text=True, check=True).stdout.split()
    used, limit = int(out[0]), int(out[1])
    assert used < limit + (2 << 20)
