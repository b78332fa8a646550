"""The sidecar's migration at start, run in a child process (``python -m collector.cli db
upgrade``): Alembic and the migration scripts are loaded, run and gone with the child, instead of
staying in the long-lived process's memory for its whole life.

The database URL goes to the child through ``FLIGHTREC_DATABASE`` in its environment, never on
its command line (``ps`` shows a command line to every user). A failed or hung migration is a
``StorageError`` like any database that is not ready: the caller keeps running and retries.
``reachable`` is the cheap check between retries (one ``SELECT 1`` through the engine this process
has anyway), so a database that stays down costs no interpreter start every few seconds.
"""

from __future__ import annotations

import asyncio
import os
import sys

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from collector.storage.connect import StorageError, make_engine

UPGRADE_TIMEOUT_S = 300.0


async def upgrade_in_child(url: str, *, timeout: float = UPGRADE_TIMEOUT_S) -> None:
    """Migrate ``url`` to head in a child process; raise ``StorageError`` when it did not."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTREC_DATABASE"}
    env["FLIGHTREC_DATABASE"] = url
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "collector.cli",
            "db",
            "upgrade",
            "--quiet",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except OSError as exc:
        raise StorageError(f"migration: cannot start {sys.executable}: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError):
        proc.kill()
        await proc.wait()
        raise StorageError(f"migration did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in (err or out).decode("utf-8", "replace").splitlines() if ln.strip()]
        raise StorageError(f"migration failed: {lines[-1] if lines else f'exit status {proc.returncode}'}")


def reachable(url: str) -> bool:
    """Whether the database answers a ``SELECT 1`` now."""
    try:
        engine = make_engine(url)
    except (SQLAlchemyError, OSError, StorageError):
        return False
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except (SQLAlchemyError, OSError, StorageError):
        return False
    finally:
        engine.dispose()
