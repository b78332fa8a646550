"""Alembic from code: ``flightrec db upgrade`` and the sidecar's start-up both call this."""

from __future__ import annotations

import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.db import StorageError


def script_location() -> Path:
    """The ``alembic/`` folder: beside the package in a checkout or editable install, or
    installed as data under ``<prefix>/share/vllm-flight-recorder/alembic``."""
    here = Path(__file__).resolve().parents[2] / "alembic"
    if (here / "env.py").is_file():
        return here
    shared = Path(sys.prefix) / "share" / "vllm-flight-recorder" / "alembic"
    if (shared / "env.py").is_file():
        return shared
    raise StorageError("cannot find the alembic migrations folder")


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
