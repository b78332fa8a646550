"""The migrations ship inside the package: a ``pip install --no-deps --target DIR`` of this tree
(the way GPU images are built) migrates a database with nothing beside it; and the sidecar's
start-up migration runs in a child process, so Alembic never loads into the long-lived one."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from collector.storage.db import StorageError
from collector.storage.migrate import script_location

ROOT = Path(__file__).resolve().parents[2]
HEAD = max(p.name.split("_", 1)[0] for p in (ROOT / "collector/storage/migrations/versions").glob("0*.py"))


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])


def test_the_migrations_are_found_inside_the_package() -> None:
    folder = script_location()
    assert folder == ROOT / "collector" / "storage" / "migrations"
    assert (folder / "env.py").is_file() and any((folder / "versions").glob("0001_*.py"))


@pytest.mark.slow
def test_a_target_install_migrates_a_database(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "rules/flightrec-alerts.yml"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "collector", src / "collector", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "target"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert not list(target.glob("share/**/alembic"))  # no migrations beside the package any more
    db = tmp_path / "f.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(target)
    run = subprocess.run(
        [sys.executable, str(target / "bin" / "flightrec"), "db", "upgrade", "--db", f"sqlite:///{db}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not this checkout: the installed copy is what runs
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"database at revision {HEAD}" in run.stdout
    assert _revision(db) == HEAD
    where = subprocess.run(
        [sys.executable, "-c", "import collector; print(collector.__file__)"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert where.stdout.strip() == str(target / "collector" / "__init__.py")


def test_startup_migration_runs_in_a_child_and_alembic_stays_out(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    code = (
        "import asyncio, sys\n"
        "import collector.service\n"
        "from collector.storage.migrate_child import upgrade_in_child\n"
        f"asyncio.run(upgrade_in_child({f'sqlite:///{db}'!r}))\n"
        "print('LOADED', sorted(m for m in sys.modules if m == 'alembic' or m.startswith('alembic.')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout
    assert _revision(db) == HEAD


def test_a_failed_child_migration_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")  # a file where the database's folder should be
    from collector.storage.migrate_child import reachable, upgrade_in_child

    url = f"sqlite:///{tmp_path / 'blocker' / 'f.db'}"
    with pytest.raises(StorageError, match="migration failed: .*blocker"):
        asyncio.run(upgrade_in_child(url))
    assert reachable(url) is False
    assert reachable(f"sqlite:///{tmp_path / 'ok.db'}") is True
