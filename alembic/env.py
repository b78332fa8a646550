"""Alembic environment: the URL comes from the caller (``flightrec db upgrade`` passes the
settings' database), from ``alembic -x db=URL``, or else from the settings (``-x config=FILE``,
``FLIGHTREC_DATABASE``, default ``sqlite:///flightrec.db``), so that ``alembic -c alembic.ini
upgrade head`` works from a checkout; runs on SQLite (batch mode) and Postgres."""

from __future__ import annotations

from alembic import context

from collector.storage.connect import is_sqlite, make_engine
from collector.storage.models import Base
from collector.storage.partitions import is_partition_name

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    x = context.get_x_argument(as_dictionary=True)
    url = x.get("db") or config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from collector.settings import SettingsError, load_settings

    try:
        return load_settings(x.get("config")).database
    except SettingsError as exc:
        raise SystemExit(f"no database URL: {exc} (pass -x db=URL, or use 'flightrec db upgrade')") from exc


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    """Time partitions (Postgres) are made by the sidecar, not described by the models."""
    return not (type_ == "table" and reflected and name is not None and is_partition_name(name))


def run_migrations_offline() -> None:
    url = _url()
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=is_sqlite(url), include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = _url()
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection, url)
        return
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn, url)
    engine.dispose()


def _run(connection, url: str) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=is_sqlite(url), include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
