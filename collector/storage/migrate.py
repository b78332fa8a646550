"""Alembic from code: ``flightrec db upgrade`` and the sidecar's start-up both call this."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.db import StorageError


def script_location() -> Path:
    """The migrations folder, inside the package (``collector/storage/migrations``), wherever
    and however it is installed (a checkout, a wheel, ``pip install --target``)."""
    folder = importlib.resources.files("collector.storage.migrations")
    path = Path(str(folder))
    if not (path / "env.py").is_file():  # a zipped install: Alembic needs a folder of files
        raise StorageError(f"cannot read the migrations as files at {folder}")
    return path


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

    from collector.storage.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise StorageError(str(exc)) from exc
    finally:
        engine.dispose()
