from __future__ import annotations

from sqlalchemy import inspect

from collector.storage.db import make_engine
from collector.storage.migrate import current, downgrade, upgrade
from collector.storage.models import Base

TABLES = {t.name for t in Base.metadata.sorted_tables}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
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


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    """Autogenerate finds nothing to do: the migration and the models agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_sqlite_runs_in_wal_mode(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()
