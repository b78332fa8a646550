"""Internal: ``flightrec report ID [-o FILE] [--bundle [FILE]] [--keep-hostnames]``: a stored snapshot as
an upstream bug report.

The Markdown goes to stdout or ``-o FILE``; ``--bundle`` also writes the redacted archive to
attach (``flightrec-report-ID.tar.gz`` unless named). Both are written from the scrubbed
snapshot (collector/report/scrub.py): request ids hashed, no prompt content, secrets and, unless
``--keep-hostnames``, host names masked. ``--from-file`` takes a snapshot export instead of an
id (one copied from another site).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from collector.cli.common import EXIT_USAGE, CliError, add_settings_options, positive_int


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        parents=parents,
        help="a snapshot as an upstream bug report (Markdown) and a redacted bundle to attach",
        description="Write a snapshot as a vLLM bug report: environment, engine arguments, connector configuration, the fault with "
        "its tracebacks and Xid, the last steps, and the replay plan as the recipe to reproduce. Request ids are hashed, prompt "
        "content is never recorded, secrets and host names are masked.",
    )
    p.add_argument("id", nargs="?", type=positive_int, help="snapshot id (from 'snapshots list')")
    p.add_argument("-o", "--output", metavar="FILE", help="write the Markdown here (default: stdout)")
    p.add_argument(
        "--bundle",
        nargs="?",
        const="",
        metavar="FILE",
        help="also write the redacted archive (report, scrubbed snapshot, manifest; at most 10 MB) (default name: flightrec-report-ID.tar.gz)",
    )
    p.add_argument("--keep-hostnames", action="store_true", help="leave host names as they are (they are replaced by host-N otherwise)")
    p.add_argument("--from-file", type=Path, metavar="EXPORT", help="a snapshot export (.json or .json.gz) instead of an id")
    add_settings_options(p)
    p.set_defaults(func=run_report)


def _export(args: argparse.Namespace) -> dict[str, Any]:
    if args.from_file is not None:
        from collector.replay.source import ReplaySourceError, from_file

        try:
            return from_file(args.from_file)
        except ReplaySourceError as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc
    if args.id is None:
        raise CliError("report needs a snapshot ID or --from-file EXPORT", EXIT_USAGE)
    from collector.cli.snapshots import _repo

    return dict(_repo(args).get_snapshot(args.id).to_export())


def _plan_text(export: dict[str, Any]) -> str | None:
    from collector.replay.plan import PlanError, build_plan
    from collector.replay.report import plan_text

    try:
        plan = build_plan(export.get("workload"), source={"id": export.get("id"), "engine": export.get("engine"), "host": export.get("host")})
    except PlanError:
        return None
    return plan_text(plan)


def _write(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only: it is still the site's data
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc


def run_report(args: argparse.Namespace) -> int:
    from collector.report.bundle import BundleTooLarge, build_bundle
    from collector.report.markdown import render
    from collector.report.scrub import Scrubber

    export = _export(args)
    clean = Scrubber(keep_hostnames=args.keep_hostnames).export(export)
    text = render(clean, plan_text=_plan_text(clean))
    if args.bundle is not None:  # first: a bundle that cannot be written fails before anything is printed
        name = args.bundle or f"flightrec-report-{export.get('id') or 'snapshot'}.tar.gz"
        try:
            body = build_bundle(export, keep_hostnames=args.keep_hostnames, report=lambda c: render(c, plan_text=_plan_text(c)))
        except BundleTooLarge as exc:
            raise CliError(str(exc)) from exc
        _write(name, body)
        print(f"wrote {name} ({len(body) / 1e6:.2f} MB)", file=sys.stderr)
    if args.output and args.output != "-":
        _write(args.output, text.encode())
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
