"""Shared fixtures: a migrated database on SQLite and on the real Postgres.

Postgres comes from ``FLIGHTREC_TEST_PG`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``);
each test gets its own schema, dropped afterwards, so runs never see each other's rows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# A property test checks what a decoder, parser or store does, never how fast: no deadline
# (hypothesis's 200 ms default failed a codec test on a loaded machine, the first example paying
# the imports). Timings are the benches' (bench/).
settings.register_profile("flightrec", deadline=None)
settings.load_profile("flightrec")

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


@dataclass
class DemoRun:
    """One ``flightrec demo --exit-after-snapshot`` run, shared by every test that reads it."""

    db: str  # SQLite URL holding the demo's snapshots
    output: str
    seconds: float
    cwd: Path | None = None  # where it ran


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    workdir = tmp_path_factory.mktemp("demo")
    prebuilt = os.environ.get("FLIGHTREC_TEST_DEMO_DB")  # a demo.db kept from an earlier run
    if prebuilt:
        shutil.copy(prebuilt, workdir / "demo.db")
        return DemoRun(f"sqlite:///{workdir / 'demo.db'}", "", 0.0)
    db = f"sqlite:///{workdir / 'demo.db'}"
    env = dict(os.environ)
    # the snapshot is amended with the late evidence (the workers' tracebacks): give it time
    env["FLIGHTREC_SNAPSHOT_SETTLE_S"] = "3"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "collector.cli", "demo", "--exit-after-snapshot", "--port", "0", "--db", db, "--workdir", str(workdir / "wd")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return DemoRun(db, proc.stdout + proc.stderr, time.monotonic() - t0, cwd=workdir)
