from __future__ import annotations

from sqlalchemy import inspect

from collector.storage.connect import make_engine
from collector.storage.migrate import current, downgrade, upgrade
from collector.storage.models import Base
from collector.storage.partitions import is_partition_name

TABLES = {t.name for t in Base.metadata.sorted_tables}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {t for t in inspect(engine).get_table_names() if not is_partition_name(t)} - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_empty_database_to_head_and_back(database_url: str) -> None:
    assert tables(database_url) == set()
    upgrade(database_url)
    assert current(database_url) is not None
    assert tables(database_url) == TABLES
    downgrade(database_url, "base")
    assert current(database_url) is None
    assert tables(database_url) == set()
    upgrade(database_url)  # and up again: the downgrade left nothing behind that breaks it
    assert tables(database_url) == TABLES


def _not_a_partition(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    return not (type_ == "table" and reflected and name is not None and is_partition_name(name))


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    """Autogenerate finds nothing to do: the migration and the models agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"include_object": _not_a_partition})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_sqlite_runs_in_wal_mode(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


def test_0003_keeps_one_row_per_event_id_and_the_link_to_its_snapshot(database_url: str) -> None:
    """Rows of one event written twice (before events had a unique id key) become one, which
    keeps the snapshot link either row had; rows without an id are left alone."""
    from sqlalchemy import text

    upgrade(database_url, "0002")
    engine = make_engine(database_url)
    cols = "(uid, ts, host, kind, source, severity, message, data, snapshot_id)"
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO incidents (key, title, opened_at, updated_at, trigger_kind, hosts, engines, snapshot_count) "
                    "VALUES ('k', 't', 1, 1, 'xid', '[]', '[]', 1)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO snapshots (incident_id, host, engine, created_at, fault_ts, trigger_kind, trigger_source, "
                    "trigger_message, step_count, request_rows, summary, fingerprint) "
                    "VALUES (1, 'a', 'e', 1, 1, 'xid', 'kmsg', 'm', 0, 0, '{}', '{}')"
                )
            )
            for uid, sid in (("u1", None), ("u1", 1), ("u2", None), (None, None), (None, None)):
                conn.execute(
                    text(f"INSERT INTO events {cols} VALUES (:uid, 1, 'a', 'xid', 'kmsg', 'critical', 'm', '{{}}', :sid)"), {"uid": uid, "sid": sid}
                )
        upgrade(database_url)
        with engine.connect() as conn:
            rows = sorted(conn.execute(text("SELECT uid, snapshot_id FROM events")), key=lambda r: (r[0] or "", r[1] or 0))
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [(None, None), (None, None), ("u1", 1), ("u2", None)]
