"""Internal: ``flightrec db upgrade|downgrade|current``: Alembic migrations, SQLite and Postgres."""

from __future__ import annotations

import argparse
from typing import Any

from collector.cli.common import (
    EXIT_USAGE,
    CliError,
    add_settings_options,
    require_existing_database,
    require_writable_database,
    settings_from,
    sqlite_path,
)


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    db = sub.add_parser("db", parents=parents, help="database migrations", description="Alembic migrations of the flight recorder's tables.")
    actions = db.add_subparsers(dest="db_action", metavar="ACTION")  # required: said by cli.parse

    up = actions.add_parser(
        "upgrade",
        parents=parents,
        help="create or migrate the tables",
        description="Create or migrate the tables (the sidecar also does this at start).",
    )
    up.add_argument("revision", nargs="?", default="head", help="target revision")
    add_settings_options(up)
    up.set_defaults(func=run_upgrade)

    down = actions.add_parser(
        "downgrade",
        parents=parents,
        help="migrate back (base drops every table)",
        description="Migrate back to REVISION; 'base' drops every table and its data.",
    )
    down.add_argument("revision", nargs="?", default=None, help="target revision, e.g. base (required unless --yes, which means base)")
    down.add_argument("--yes", action="store_true", help="confirm dropping everything when no revision is named")
    add_settings_options(down)
    down.set_defaults(func=run_downgrade)

    cur = actions.add_parser(
        "current", parents=parents, help="print the database's revision", description="Print the database's revision; creates nothing."
    )
    add_settings_options(cur)
    cur.set_defaults(func=run_current)


def _migrate(action: str, fn: Any, url: str, revision: str) -> None:
    """Run a migration; a revision Alembic does not know is a usage error in one line (it was
    a 71-line traceback)."""
    from alembic.util import CommandError

    path = sqlite_path(url)
    existed = path is not None and path.exists()
    try:
        fn(url, revision)
    except CommandError as exc:
        if path is not None and not existed:
            for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                leftover.unlink(missing_ok=True)  # a bad revision leaves no new empty database behind
        raise CliError(
            f"db {action} {revision}: {exc} (use head, base, or a revision id; 'flightrec db current' prints the database's)", EXIT_USAGE
        ) from exc


def _print_current(url: str) -> None:
    from collector.storage.migrate import current

    print(f"database at revision {current(url) or 'base'}")


def run_upgrade(args: argparse.Namespace) -> int:
    from collector.fleet.placement import placement
    from collector.storage.migrate import upgrade

    place = placement(settings_from(args))
    for url in [u for u in (place.local, place.shared) if u is not None]:  # a fleet's node: both stores
        require_writable_database(url)
        _migrate("upgrade", upgrade, url, args.revision)
        _print_current(url)
    return 0


def run_downgrade(args: argparse.Namespace) -> int:
    from collector.storage.migrate import downgrade

    if args.revision is None and not args.yes:
        raise CliError("db downgrade drops every table and its data: name the revision ('flightrec db downgrade base') or pass --yes", EXIT_USAGE)
    url = settings_from(args).database
    require_existing_database(url)
    _migrate("downgrade", downgrade, url, args.revision or "base")
    _print_current(url)
    return 0


def run_current(args: argparse.Namespace) -> int:
    url = settings_from(args).database
    require_existing_database(url)
    _print_current(url)
    return 0
