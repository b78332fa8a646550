"""``flightrec``: the command line.

    flightrec serve [--config FILE] [--host H] [--port P] [--db URL]
    flightrec demo [--exit-after-snapshot] [--port P] [--db URL] [--workdir DIR]
    flightrec db upgrade [REV] | downgrade REV|--yes | current   [--db URL]
    flightrec snapshots list [--limit N] [--engine E] | show ID | export ID [-o FILE|-]
    flightrec inspect-log FILE|- [--json]
    flightrec report ID [-o FILE] [--bundle [FILE]] [--keep-hostnames] | --from-file EXPORT
    flightrec replay SNAPSHOT_ID --target URL [--speed X] [--model NAME] | --plan SNAPSHOT_ID
    flightrec health [--config FILE] [--port P]
    flightrec simulate --engines N --running R --steps-per-second S --recorder-dir DIR [...]

Each subcommand is a module with ``register(subparsers, parents)`` that adds its parser and
sets ``func``; ``COMMANDS`` lists them in help order. Exit codes are in ``cli/common.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

# httpx's package imports its own command-line client (``httpx._main``: click, rich, pygments)
# to offer ``httpx.main``, which nothing here calls: 7 MiB of every flightrec process where those
# are installed (a test environment's; the image has no rich). Marked absent, that import takes
# httpx's own fallback (``sys.modules[name] = None`` makes an import raise ImportError).
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from collector import __version__
from collector.cli import db, health, inspect_log, report, rules, serve, snapshots
from collector.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    HelpFormatter,
)
from collector.redact import redact_text
from collector.settings import SettingsError

__all__ = ["COMMANDS", "build_parser", "main"]


class _Replay:
    """``flightrec replay`` (collector/cli/replay.py) builds its own parser; this adapts it."""

    @staticmethod
    def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
        from collector.cli import replay
        from collector.cli.common import settings_from

        replay.add_parser(sub, parents)
        parser = sub.choices["replay"]
        for action in parser._actions:  # every option's help says something (and its default)
            if action.help is None and action.dest == "id":
                action.help = "the snapshot whose recorded load to replay"
        parser.set_defaults(func=lambda args: replay.main(args, settings_from(args)))


class _Simulate:
    """``flightrec simulate`` (collector/cli/simulate.py) adds its own arguments; this registers it."""

    @staticmethod
    def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
        from collector.cli import simulate

        parser = sub.add_parser(
            "simulate", parents=parents, formatter_class=HelpFormatter, help="a node-sized load of simulated engines, for sizing the sidecar"
        )
        simulate.add_arguments(parser)
        parser.set_defaults(func=simulate.main)


# Subcommand modules, in the order `flightrec --help` lists them. A new command is a module
# with register(sub, parents) and one line here.
COMMANDS: list[Any] = [serve, db, snapshots, report, inspect_log, health, rules, _Replay, _Simulate]

# Libraries whose INFO lines are noise to an operator (each migration step, each request).
QUIET_LOGGERS = ("alembic", "uvicorn", "uvicorn.error", "httpx", "httpcore", "asyncio")


def _log_options() -> argparse.ArgumentParser:
    """-v/-q accepted before and after the subcommand (``flightrec -v serve`` and
    ``flightrec serve -v``); SUPPRESS keeps a subcommand's absent flag from resetting the
    global one."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="more log lines: -v DEBUG for flightrec (default INFO)")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="only warnings and errors")
    return p


def build_parser() -> argparse.ArgumentParser:
    log_opts = _log_options()
    parser = argparse.ArgumentParser(
        prog="flightrec",
        description="vLLM Flight Recorder: crash snapshots of vLLM engines.",
        formatter_class=HelpFormatter,
        parents=[log_opts],
        epilog="exit codes: 0 ok, 1 runtime failure, 2 bad arguments or settings, 130 interrupted, 141 output closed early",
    )
    parser.add_argument("--version", action="version", version=f"flightrec {__version__}")
    # not required here: ``parse`` says a missing command itself, after naming any bad flag
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub, [log_opts])
    _defaults_everywhere(parser)
    return parser


def _defaults_everywhere(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's help shows the defaults (the formatter is read at help time)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.formatter_class = HelpFormatter
                _defaults_everywhere(child)


class RedactingFilter(logging.Filter):
    """The sidecar's own log lines quote what it was given (a trigger's message, a manual
    reason, an engine's URL): they are redacted like everything else it keeps."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # a bad format string: logging reports it itself
            return True
        clean = redact_text(text)
        if clean != text:
            record.msg, record.args = clean, None
        return True


def setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("collector").setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, with the error said by the parser the user was in: a bad flag after
    ``snapshots list`` shows that command's usage, a bad flag before any command is named
    (argparse alone would only say a command is required). Exits 2 on a usage error."""
    args, rest = parser.parse_known_args(argv)
    deepest = parser
    while True:
        subs = [a for a in deepest._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        chosen = getattr(args, subs[0].dest, None)
        if chosen is None:
            if rest:
                deepest.error(f"unrecognized arguments: {' '.join(rest)}")
            deepest.error(f"{subs[0].metavar or 'COMMAND'} is required, one of: {', '.join(subs[0].choices)}")
        deepest = subs[0].choices[chosen]
    if rest:
        deepest.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    setup_logging(getattr(args, "verbose", 0) or 0, bool(getattr(args, "quiet", False)))
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"flightrec: {exc}", file=sys.stderr)
        return exc.code
    except SettingsError as exc:
        print(f"flightrec: invalid settings:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader stopped early (`| head`): not an error worth a line. stdout now points
        # at /dev/null so the interpreter's flush at exit does not raise again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        from collector.storage.connect import StorageError

        if isinstance(exc, StorageError):
            print(f"flightrec: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
