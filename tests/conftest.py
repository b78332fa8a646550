"""Shared fixtures: a migrated database on SQLite and on the real Postgres.

Postgres comes from ``FLIGHTREC_TEST_PG`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``);
each test gets its own schema, dropped afterwards, so runs never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_URL = os.environ.get("FLIGHTREC_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_admin_url() -> str:
    return PG_URL.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'flightrec.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    import psycopg

    schema = f"flightrec_t_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(_pg_admin_url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"the real Postgres at {PG_URL} is not reachable: {exc} (.ci/run starts it)")
    sep = "&" if "?" in PG_URL else "?"
    yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(_pg_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """An empty database URL, on SQLite and on Postgres."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def migrated_url(database_url: str) -> str:
    from collector.storage.migrate import upgrade

    upgrade(database_url)
    return database_url
