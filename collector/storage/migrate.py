"""Alembic from code: ``flightrec db upgrade`` and the sidecar's start-up both call this."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import SQLAlchemyError

import collector
from collector.storage.connect import StorageError

MIGRATIONS_PACKAGE = "collector.storage.migrations"


def script_location() -> Path:
    """The migrations folder. An install (a wheel, ``pip install --target``, the image) carries
    ``alembic/`` inside the package as ``collector.storage.migrations`` (setup.py maps it); a
    checkout run without installing (``PYTHONPATH=.``) has it at the top, beside ``collector/``."""
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec(MIGRATIONS_PACKAGE)
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations is not None:
        candidates += [Path(p) for p in spec.submodule_search_locations]
    candidates.append(Path(collector.__file__).resolve().parents[1] / "alembic")
    for path in candidates:
        if (path / "env.py").is_file() and (path / "versions").is_dir():
            return path
    # a zipped install: Alembic needs a folder of files
    raise StorageError(f"cannot read the migrations as files (looked in {', '.join(map(str, candidates))})")


def _config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    try:
        command.upgrade(_config(url), revision)
    except (SQLAlchemyError, OSError) as exc:
        raise StorageError(f"migration failed: {exc}") from exc


def downgrade(url: str, revision: str = "base") -> None:
    try:
        command.downgrade(_config(url), revision)
    except (SQLAlchemyError, OSError) as exc:
        raise StorageError(f"migration failed: {exc}") from exc


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from collector.storage.connect import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise StorageError(str(exc)) from exc
    finally:
        engine.dispose()
