"""Time partitions of the shared store's growing tables, on Postgres only (declarative range
partitioning on ``ts``, unix seconds): ``events``, ``engine_series`` and ``gpu_series``.

Retention is dropping a partition (``drop_before``), which frees its disk at once and writes
no WAL per row, where ``DELETE`` would leave dead rows for vacuum to find. The sidecar creates
partitions ahead of time (``ensure``: the current span and ``AHEAD`` more), so an insert never
waits on DDL; a row outside every partition (a clock far off, a spooled row older than the
oldest partition kept) lands in the table's DEFAULT partition rather than failing, and ``ensure``
moves such rows into a partition when it creates one for their span (Postgres refuses a new
partition whose range the default already holds rows of).

Partition names carry their start in UTC: ``events_p2026120300`` starts 2026-12-03 00:00. The
bounds read back are the catalog's own (``pg_get_expr``), not the name's.

Several sidecars run this at once against one database: each works under one advisory lock
and looks at the catalog before it changes anything, so the common case (nothing to do) takes
no lock on the tables.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.connect import translate

PARTITIONED = ("events", "engine_series", "gpu_series")
AHEAD = 2  # spans created beyond the current one
LOCK_KEY = 0x464C_5041_5254  # "FLPART": one partition maintainer at a time per database
_BOUND = re.compile(r"FROM \('?(-?[0-9.e+]+)'?\) TO \('?(-?[0-9.e+]+)'?\)")


@dataclass(frozen=True)
class Partition:
    name: str
    start: float | None  # None: the DEFAULT partition
    end: float | None


def is_partition_name(name: str) -> bool:
    """A partition of one of ours (migrations' autogenerate and the schema checks skip them)."""
    return any(name == f"{t}_default" or re.fullmatch(rf"{t}_p[0-9]{{10}}", name) is not None for t in PARTITIONED)


def span_start(ts: float, span_s: float) -> float:
    return math.floor(ts / span_s) * span_s


def partition_name(table: str, start: float) -> str:
    return f"{table}_p{datetime.fromtimestamp(start, UTC):%Y%m%d%H}"


def is_partitioned(conn: Connection, table: str) -> bool:
    row = conn.execute(
        text("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(:t)"),
        {"t": table},
    ).first()
    return row is not None and row[0] == "p"


def partitions(conn: Connection, table: str) -> list[Partition]:
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t) ORDER BY c.relname"
        ),
        {"t": table},
    ).all()
    out = []
    for name, bound in rows:
        m = _BOUND.search(bound or "")
        out.append(Partition(name, float(m.group(1)), float(m.group(2))) if m else Partition(name, None, None))
    return out


def create_default(conn: Connection, table: str) -> None:
    conn.execute(text(f'CREATE TABLE IF NOT EXISTS "{table}_default" PARTITION OF "{table}" DEFAULT'))


def ensure(conn: Connection, table: str, *, now: float, span_s: float, ahead: int = AHEAD, since: float | None = None) -> list[str]:
    """Create the partitions of ``table`` from the span holding ``since`` (default ``now``) to
    ``ahead`` spans past the one holding ``now``; returns the names created. A span already
    covered by any partition (one of another span length) is left as it is."""
    have = [p for p in partitions(conn, table) if p.start is not None]
    first = span_start(now if since is None else min(since, now), span_s)
    last = span_start(now, span_s) + ahead * span_s
    wanted = []
    start = first
    while start <= last:
        end = start + span_s
        if not any(p.start is not None and p.end is not None and p.start < end and start < p.end for p in have):
            wanted.append((start, end))
        start = end
    if not wanted:
        return []
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
    have = [p for p in partitions(conn, table) if p.start is not None]  # another sidecar may have made them
    made = []
    for lo, hi in wanted:
        if any(p.start is not None and p.end is not None and p.start < hi and lo < p.end for p in have):
            continue
        name = partition_name(table, lo)
        _move_default_rows(conn, table, lo, hi, name)
        made.append(name)
    return made


def _move_default_rows(conn: Connection, table: str, lo: float, hi: float, name: str) -> None:
    """Create partition ``name`` for [lo, hi); rows the DEFAULT partition holds in that range are
    moved into it (Postgres would refuse the new partition otherwise)."""
    default = f"{table}_default"
    held = False
    if conn.execute(text("SELECT to_regclass(:d)"), {"d": default}).scalar() is not None:
        probe = text(f'SELECT 1 FROM "{default}" WHERE ts >= :lo AND ts < :hi LIMIT 1')  # noqa: S608 - our own names
        held = conn.execute(probe, {"lo": lo, "hi": hi}).first() is not None
    if not held:
        conn.execute(text(f'CREATE TABLE "{name}" PARTITION OF "{table}" FOR VALUES FROM ({lo!r}) TO ({hi!r})'))
        return
    conn.execute(text(f'ALTER TABLE "{table}" DETACH PARTITION "{default}"'))
    conn.execute(text(f'CREATE TABLE "{name}" PARTITION OF "{table}" FOR VALUES FROM ({lo!r}) TO ({hi!r})'))
    conn.execute(
        text(f'INSERT INTO "{table}" SELECT * FROM "{default}" WHERE ts >= :lo AND ts < :hi'),  # noqa: S608
        {"lo": lo, "hi": hi},
    )
    conn.execute(text(f'DELETE FROM "{default}" WHERE ts >= :lo AND ts < :hi'), {"lo": lo, "hi": hi})  # noqa: S608
    conn.execute(text(f'ALTER TABLE "{table}" ATTACH PARTITION "{default}" DEFAULT'))


def drop_before(conn: Connection, table: str, cutoff: float) -> list[str]:
    """Drop the partitions of ``table`` that end at or before ``cutoff``; returns their names."""
    old = [p for p in partitions(conn, table) if p.end is not None and p.end <= cutoff]
    if not old:
        return []
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
    for p in old:
        conn.execute(text(f'DROP TABLE IF EXISTS "{p.name}"'))
    return [p.name for p in old]


def maintain(db: Engine, *, span_s: float, keep_s: dict[str, float], now: float | None = None, ahead: int = AHEAD) -> dict[str, dict[str, list[str]]]:
    """The periodic pass the sidecar runs on a Postgres store: for each partitioned table,
    partitions created ahead and those past ``keep_s[table]`` dropped. A table that is not
    partitioned (SQLite, or a store before 0004) is skipped. Raises StorageError."""
    now = time.time() if now is None else now
    out: dict[str, dict[str, list[str]]] = {}
    if db.dialect.name != "postgresql":
        return out
    try:
        for table in PARTITIONED:
            with db.begin() as conn:
                if not is_partitioned(conn, table):
                    continue
                made = ensure(conn, table, now=now, span_s=span_s, ahead=ahead)
                dropped = drop_before(conn, table, now - keep_s[table]) if table in keep_s else []
            out[table] = {"created": made, "dropped": dropped}
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    return out
