"""The migrations' home is ``alembic/`` at the top of the checkout (``alembic -c alembic.ini``
runs them there), and the same files ship inside the package as ``collector.storage.migrations``:
a wheel, and a ``pip install --no-deps --target DIR`` of this tree (the way GPU images are
built), migrate a database with nothing beside the package; and the sidecar's start-up
migration runs in a child process, so Alembic never loads into the long-lived one."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from collector.storage.connect import StorageError
from collector.storage.migrate import script_location

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = sorted(p.name for p in (ROOT / "alembic/versions").glob("0*.py"))
HEAD = VERSIONS[-1].split("_", 1)[0]
SHIPPED = "collector/storage/migrations"


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])


def _env(pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env["PYTHONPATH"] = str(pythonpath)
    return env


def _source_tree(tmp_path: Path) -> Path:
    """What a build sees: the files the Dockerfile copies."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "rules/flightrec-alerts.yml"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for folder in ("collector", "alembic"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _upgrade_with(installed: Path, tmp_path: Path, argv0: list[str]) -> None:
    """``flightrec db upgrade`` from the installed copy, run away from this checkout."""
    db = tmp_path / "f.db"
    env = _env(installed)
    run = subprocess.run(
        [sys.executable, *argv0, "db", "upgrade", "--db", f"sqlite:///{db}"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"database at revision {HEAD}" in run.stdout
    assert _revision(db) == HEAD
    code = "import collector.storage.migrate as m; print(m.script_location())"
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert where.stdout.strip() == str(installed / SHIPPED), where.stderr[-2000:]


def test_the_checkout_finds_the_migrations_at_the_top() -> None:
    folder = script_location()
    assert folder == ROOT / "alembic"
    assert (folder / "env.py").is_file() and (folder / "script.py.mako").is_file() and VERSIONS[0].startswith("0001_")
    assert not (folder / "__init__.py").exists()  # a package here would shadow the alembic library


def test_alembic_ini_upgrades_from_a_checkout(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    alembic = Path(sys.executable).with_name("alembic")
    run = subprocess.run(
        [str(alembic), "-c", str(ROOT / "alembic.ini"), "-x", f"db=sqlite:///{db}", "upgrade", "head"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # the ini finds its folder, wherever it is run from
        env=_env(tmp_path),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert _revision(db) == HEAD


@pytest.mark.slow
def test_a_wheel_carries_the_migrations_inside_the_package(tmp_path: Path) -> None:
    src = _source_tree(tmp_path)
    dist = tmp_path / "dist"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"{SHIPPED}/env.py", f"{SHIPPED}/script.py.mako"} | {f"{SHIPPED}/versions/{v}" for v in VERSIONS} <= names
    assert not [n for n in names if n.startswith("alembic/")]  # never a top-level alembic beside the library
    installed = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(installed)  # what an installer does with a pure wheel's files
    _upgrade_with(installed, tmp_path, ["-m", "collector.cli"])


@pytest.mark.slow
def test_a_target_install_migrates_a_database(tmp_path: Path) -> None:
    src = _source_tree(tmp_path)
    target = tmp_path / "target"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert not (target / "alembic").exists() and not list(target.glob("share/**/alembic"))  # only inside the package
    _upgrade_with(target, tmp_path, [str(target / "bin" / "flightrec")])
    where = subprocess.run(
        [sys.executable, "-c", "import collector; print(collector.__file__)"], capture_output=True, text=True, cwd=tmp_path, env=_env(target)
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
    env = _env(ROOT)
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
