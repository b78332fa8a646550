"""``flightrec snapshots list|show|export``: read stored snapshots. Read-only: a missing
database is an error, nothing is created."""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import sys
import time
from typing import Any

from collector.cli.common import (
    EXIT_USAGE,
    CliError,
    add_settings_options,
    open_output,
    positive_int,
    require_existing_database,
    settings_from,
)


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    snaps = sub.add_parser(
        "snapshots", parents=parents, help="read stored snapshots", description="Read the snapshots a sidecar stored; creates nothing."
    )
    actions = snaps.add_subparsers(dest="snapshots_action", required=True, metavar="ACTION")

    ls = actions.add_parser("list", parents=parents, help="stored snapshots, newest first", description="Stored snapshots, newest first.")
    ls.add_argument("--limit", type=positive_int, default=20, help="how many rows (1 or more)")
    ls.add_argument("--engine", help="only this engine's snapshots (default: every engine)")
    add_settings_options(ls)
    ls.set_defaults(func=run_list)

    show = actions.add_parser(
        "show",
        parents=parents,
        help="one snapshot's summary as JSON",
        description="One snapshot's summary and events as JSON (counts instead of the bulky parts).",
    )
    show.add_argument("id", type=positive_int, help="snapshot id (from 'snapshots list')")
    add_settings_options(show)
    show.set_defaults(func=run_show)

    export = actions.add_parser(
        "export",
        parents=parents,
        help="one snapshot's full gzip JSON export",
        description="Write one snapshot's full export (gzip JSON, schema flightrec.snapshot/v1).",
    )
    export.add_argument("id", type=positive_int, help="snapshot id (from 'snapshots list')")
    export.add_argument("-o", "--output", metavar="FILE", help="file to write, '-' for stdout (default: flightrec-snapshot-ID.json.gz)")
    add_settings_options(export)
    export.set_defaults(func=run_export)


def _repo(args: argparse.Namespace) -> Any:
    from collector.storage.db import make_engine
    from collector.storage.migrate import current
    from collector.storage.repo import Repository

    settings = settings_from(args)
    require_existing_database(settings.database)
    if current(settings.database) is None:
        raise CliError(
            f"the database at --db {settings.database} has no flightrec tables (is it the sidecar's? 'flightrec db upgrade' creates them)", EXIT_USAGE
        )
    return Repository(make_engine(settings.database), host=settings.host_name or socket.gethostname())


def run_list(args: argparse.Namespace) -> int:
    from collector.storage.repo import SnapshotFilter

    rows, _ = _repo(args).list_snapshots(SnapshotFilter(engine=args.engine), limit=args.limit)
    out = sys.stdout
    out.write(f"{'id':>5}  {'created (UTC)':19}  {'host':16} {'engine':14} {'trigger':15} {'steps':>6} {'reqs':>7}  message\n")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["created_at"]))
        out.write(
            f"{r['id']:>5}  {when}  {r['host'][:16]:16} {r['engine'][:14]:14} {r['trigger_kind'][:15]:15} "
            f"{r['step_count']:>6} {r['request_rows']:>7}  {r['trigger_message'][:70]}\n"
        )
    out.flush()
    return 0


def run_show(args: argparse.Namespace) -> int:
    doc = _repo(args).get_snapshot(args.id)
    out = {k: v for k, v in doc.to_export().items() if k not in ("steps", "requests", "gpu_samples", "log_lines")}
    out["events"] = [{k: e.get(k) for k in ("ts", "kind", "source", "process", "xid", "message")} for e in doc.events]
    out["counts"] = {k: len(doc.part(k)) for k in ("steps", "requests", "gpu_samples", "events", "log_lines")}
    sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
    sys.stdout.flush()
    return 0


def run_export(args: argparse.Namespace) -> int:
    name = args.output or f"flightrec-snapshot-{args.id}.json.gz"
    if name == "-" and sys.stdout.isatty():
        open_output(name)  # raises: gzip to a terminal
    doc = _repo(args).get_snapshot(args.id)  # before opening: an unknown id leaves no empty file
    body = gzip.compress(json.dumps(doc.to_export(), default=str).encode())
    fh = open_output(name)
    if name == "-":
        fh.write(body)
        fh.flush()
        return 0
    try:
        with fh:
            fh.write(body)
    except OSError as exc:
        raise CliError(f"cannot write {name}: {exc.strerror or exc}") from exc
    print(f"wrote {name}")
    return 0
