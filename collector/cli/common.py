"""Internal: what every ``flightrec`` subcommand shares: the failure type, the settings options, the
SQLite pre-flight checks and ``-`` as stdin/stdout.

Exit codes (one place, so every command agrees):

    0    done
    1    a runtime failure: the database refused, a port is busy, a file cannot be written
    2    bad arguments or settings, a database that does not exist, input that is not a log
    130  interrupted (Ctrl-C)
    141  stdout closed early (``| head``): silent, as a tool killed by SIGPIPE

A command raises ``CliError(message, code)``; ``main`` prints ``flightrec: message`` as one
line on stderr and exits with ``code``. Nothing else reaches the user as a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import IO, Any

from collector.errors import FlightrecError
from collector.settings import Settings, load_settings
from collector.storage.connect import is_sqlite, private_file

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


class CliError(FlightrecError):
    """A failure the user can act on: one line, one exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after every option's help; descriptions keep their line breaks. An
    option whose default comes from the settings (``None`` here) or whose help already says
    its default gets no second "(default: ...)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or isinstance(action.default, bool) or "default" in text:
            return text
        return super()._get_help_string(action)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def add_settings_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML settings file (docs/configuration.md)")
    p.add_argument(
        "--db",
        dest="database",
        metavar="URL",
        help="database URL, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB (default: the settings' database, sqlite:///flightrec.db)",
    )


def settings_from(args: argparse.Namespace, **overrides: Any) -> Settings:
    merged = {"database": getattr(args, "database", None), **overrides}
    return load_settings(getattr(args, "config", None), **merged)


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, or None (Postgres, ``:memory:``)."""
    if not is_sqlite(url) or "///" not in url:
        return None
    raw = url.split("///", 1)[1].split("?", 1)[0]
    if not raw or raw == ":memory:":
        return None
    return Path(raw).expanduser()


def require_existing_database(url: str) -> None:
    """Read-only commands never create a database: a missing SQLite file is an error that
    names ``--db`` (connecting would create the file and its folder)."""
    path = sqlite_path(url)
    if path is None:
        return
    if not path.exists():
        hint = ""
        if not path.is_absolute():  # sqlite:///data/x.db is data/x.db here; an absolute path takes four slashes
            hint = f" ({path} is relative to this folder, {Path.cwd()}; an absolute path takes four slashes: sqlite:///{Path('/') / path})"
        raise CliError(
            f"no database at {path}{hint} (--db {url}); point --db at the sidecar's database or create one with 'flightrec db upgrade --db URL'",
            EXIT_USAGE,
        )
    if not path.is_file():
        raise CliError(f"--db {url}: {path} is not a file", EXIT_USAGE)


def require_writable_database(url: str) -> None:
    """A SQLite path that can never be written (a read-only folder, /proc, a file in place
    of a folder) is a setting error, exit 2; retrying it forever is right only for a
    database that is down. Tried for real (permission bits say little to root)."""
    path = sqlite_path(url)
    if path is None:
        return
    existed = path.exists()
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        private_file(path)  # as make_engine does: folders 0700, the file 0600
        with open(path, "ab"):
            pass
        probe = path.with_name(path.name + "-journal-probe")  # SQLite's WAL and journal live beside it
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CliError(f"database: cannot write {path}: {exc.strerror or exc} (--db {url})", EXIT_USAGE) from exc
    finally:
        if not existed and path.is_file() and path.stat().st_size == 0:
            path.unlink()  # leave no trace of the probe; SQLite creates the file itself


def open_output(name: str) -> IO[bytes]:
    """``-`` is stdout (refused on a terminal: the export is gzip); anything else a file readable
    by its owner only (an export holds the engine's own words: prompts' shapes, log lines), an
    existing one made so before anything is written."""
    if name == "-":
        if sys.stdout.isatty():
            raise CliError("refusing to write gzip data to a terminal; redirect stdout or use -o FILE", EXIT_USAGE)
        return sys.stdout.buffer
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "wb")
    except OSError as exc:
        raise CliError(f"cannot write {name}: {exc.strerror or exc}") from exc
