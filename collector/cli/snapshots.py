"""Internal: ``flightrec snapshots list|show|export``: read stored snapshots. Read-only: a missing
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
    actions = snaps.add_subparsers(dest="snapshots_action", metavar="ACTION")  # required: said by cli.parse

    ls = actions.add_parser("list", parents=parents, help="stored snapshots, newest first", description="Stored snapshots, newest first.")
    ls.add_argument("--limit", type=positive_int, default=20, help="how many rows (1 or more)")
    ls.add_argument("--engine", help="only this engine's snapshots (default: every engine)")
    add_settings_options(ls)
    ls.set_defaults(func=run_list)

    show = actions.add_parser(
        "show",
        parents=parents,
        help="one snapshot's summary",
        description="One snapshot's summary: the fault, the failed processes, the load at the last step, the events. "
        "--json prints everything but the steps, request rows, GPU samples and log lines (their counts instead).",
    )
    show.add_argument("id", type=positive_int, help="snapshot id (from 'snapshots list')")
    show.add_argument("--json", action="store_true", help="the whole summary, the fingerprint, the events and the raw scrapes as JSON")
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
    from collector.storage.connect import make_engine
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
    # a wedge's stacks: their summary only (summary.stacks); the export and the page hold them whole
    out = {k: v for k, v in doc.to_export().items() if k not in ("steps", "requests", "gpu_samples", "log_lines", "stacks")}
    out["events"] = [{k: e.get(k) for k in ("ts", "kind", "source", "process", "xid", "message")} for e in doc.events]
    out["counts"] = {k: len(doc.part(k)) for k in ("steps", "requests", "gpu_samples", "events", "log_lines")}
    text = json.dumps(out, indent=2, default=str) if args.json else show_text(out)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d} UTC" if isinstance(ts, (int, float)) else "?"


def show_text(snap: dict[str, Any]) -> str:
    """A screenful: what the page's header and checklist say first (the rest: --json, the page)."""
    s = snap.get("summary") or {}
    trig = snap.get("trigger") or {}
    fp = snap.get("fingerprint") or {}
    counts = snap.get("counts") or {}
    reqs = s.get("requests_at_last_step") or {}
    lines = [
        f"snapshot {snap.get('id')} of {snap.get('engine')} on {snap.get('host')} (incident {snap.get('incident_id') or '-'})",
        f"  fault       {_when(snap.get('fault_ts'))}: {trig.get('kind', '?')} from {trig.get('source', '?')}: {trig.get('message', '')}",
        f"  vLLM        {fp.get('vllm_version') or 'not recorded'}; model {fp.get('model') or fp.get('served_model_name') or 'not recorded'}",
        f"  steps       {s.get('step_count', 0)} recorded ({s.get('first_step')}-{s.get('last_step')}); "
        f"running {s.get('running')}, waiting {s.get('waiting')}, kv_cache_usage {s.get('kv_cache_usage')} at the last step",
    ]
    if reqs:
        mirror = reqs.get("mirror_rows") or {}
        lines.append(
            f"  requests    {reqs.get('count')} at step {reqs.get('step')}: "
            f"context {reqs.get('context_len_min')}-{reqs.get('context_len_max')} tokens"
            + (f", host-mirror rows {sum(mirror.values())} over {len(mirror)} requests" if mirror else "")
        )
    if s.get("xids"):
        lines.append(f"  Xid         {', '.join(str(x) for x in s['xids'])}")
    for proc, f in (s.get("failed_processes") or {}).items():
        lines.append(f"  failed      {proc} at step {f.get('step')}: {f.get('message', '')}")
    stacks = s.get("stacks") or {}
    if stacks:  # a wedge's snapshot: each process's blocking frame (collector.stacks.part.summary)
        lines.append(f"  stacks      {stacks.get('status')}" + (f": {stacks['reason']}" if stacks.get("reason") else ""))
        for p in stacks.get("processes") or []:
            lines.append(
                f"    {str(p.get('role')):12} pid {p.get('pid')}: {p.get('state')}" + (f", blocked at {p['blocking']}" if p.get("blocking") else "")
            )
    lines.append("  counts      " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    events = snap.get("events") or []
    if events:
        lines.append("  events")
        for e in events[:20]:
            lines.append(f"    {_when(e.get('ts'))}  {str(e.get('kind')):14} {str(e.get('process') or ''):16} {str(e.get('message') or '')[:100]}")
        if len(events) > 20:
            lines.append(f"    ... {len(events) - 20} more (--json)")
    lines.append(
        f"  more: 'flightrec snapshots show {snap.get('id')} --json', 'flightrec report {snap.get('id')}', or the page /snapshots/{snap.get('id')}"
    )
    return "\n".join(lines)


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
