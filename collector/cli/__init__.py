"""``flightrec``: the command line.

    flightrec serve [--config FILE] [--host H] [--port P] [--db URL]
    flightrec demo [--exit-after-snapshot] [--port P] [--db URL] [--speed N]
    flightrec db upgrade|downgrade|current [--db URL]
    flightrec snapshots list|show ID|export ID [--db URL]
    flightrec inspect-log FILE [--json]
    flightrec replay SNAPSHOT_ID --target URL [--speed X] [--model NAME] | --plan SNAPSHOT_ID
    flightrec simulate --engines N --running R --steps-per-second S --recorder-dir DIR [...]

Exit codes: 0 ok, 1 runtime failure, 2 bad settings or arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from collector import __version__
from collector.settings import Settings, SettingsError, load_settings


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--db", dest="database", help="database URL (sqlite:///... or postgresql+psycopg://...)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flightrec", description="vLLM Flight Recorder")
    parser.add_argument("--version", action="version", version=f"flightrec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the sidecar")
    _common(serve)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)

    demo = sub.add_parser("demo", help="the sidecar plus a simulated P/D pair that crashes like the incident")
    _common(demo)
    demo.add_argument("--port", type=int)
    demo.add_argument("--exit-after-snapshot", action="store_true", help="exit 0 once the crash snapshot is stored")
    demo.add_argument("--speed", type=float, default=1500.0, help="simulated engine steps per second")
    demo.add_argument("--workdir", default="flightrec-demo", help="folder for the simulated logs and rings")
    demo.add_argument("--serve-completions", action="store_true",
                      help="no built-in load: the pair serves /v1/completions, for flightrec replay")

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "downgrade", "current"])
    db.add_argument("revision", nargs="?", help="default: head for upgrade, base for downgrade")
    _common(db)

    snaps = sub.add_parser("snapshots", help="read stored snapshots")
    snaps.add_argument("action", choices=["list", "show", "export"])
    snaps.add_argument("id", nargs="?", type=int)
    snaps.add_argument("--limit", type=int, default=20)
    snaps.add_argument("--engine")
    snaps.add_argument("-o", "--output", help="export: file to write (default flightrec-snapshot-ID.json.gz)")
    _common(snaps)

    insp = sub.add_parser("inspect-log", help="offline post-mortem of an engine log")
    insp.add_argument("file")
    insp.add_argument("--json", action="store_true")

    from collector.cli.replay import add_parser as add_replay

    add_replay(sub)

    from collector.cli import simulate

    simulate.add_arguments(sub.add_parser("simulate", help="a node-sized load of simulated engines, for sizing"))
    return parser


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    overrides = {"database": getattr(args, "database", None), **extra}
    return load_settings(getattr(args, "config", None), **overrides)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "serve":
            return _serve(_settings(args, host=args.host, port=args.port))
        if args.command == "demo":
            return _demo(args)
        if args.command == "db":
            return _db(args, _settings(args))
        if args.command == "snapshots":
            return _snapshots(args, _settings(args))
        if args.command == "inspect-log":
            from collector.cli.inspect_log import main as inspect_main

            return inspect_main(args.file, args.json)
        if args.command == "replay":
            from collector.cli.replay import main as replay_main

            return replay_main(args, _settings(args))
        if args.command == "simulate":
            from collector.cli.simulate import main as simulate_main

            return simulate_main(args)
    except SettingsError as exc:
        print(f"flightrec: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


def _check_bind(settings: Settings) -> None:
    token = settings.api_token.get_secret_value().strip() if settings.api_token is not None else ""
    if not settings.loopback_only and not token:
        raise SettingsError(f"host: binding {settings.host} needs api_token (reads then require the token)")


def _serve(settings: Settings) -> int:
    from collector.service import Service

    _check_bind(settings)
    svc = Service(settings)
    asyncio.run(svc.run())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from collector.service import Service
    from collector.sim.pair import PairConfig, SimPair
    from collector.sources.nvml import NvmlSource

    base = _settings(args, port=args.port)
    _check_bind(base)
    workdir = Path(args.workdir).resolve()
    recorder_dir = workdir / "recorder"
    if recorder_dir.is_dir():  # rings of an earlier demo run are history, not this pair
        for old in recorder_dir.glob("*.ring"):
            old.unlink()

    async def run() -> int:
        pair = SimPair(PairConfig(workdir=workdir, recorder_dir=recorder_dir, steps_per_second=args.speed,
                                  serve_completions=args.serve_completions))
        await pair.start()
        settings = base.model_copy(update={
            "engines": pair.engine_configs(), "recorder_dir": recorder_dir, "kmsg": str(pair.kmsg_path),
            "nvml": "off", "scrape_interval": min(base.scrape_interval, 1.0),
        })  # fmt: skip
        svc = Service(settings, extra_sources=[NvmlSource(pair.nvml, interval=0.5)])
        stored = asyncio.Event()

        def on_snapshot(doc: Any, trigger: Any) -> None:
            if doc.engine == "decode-0":
                print(f"crash snapshot {doc.id} of {doc.engine} (trigger {trigger.kind.value}: {trigger.message[:100]})")
                print(f"  page:   {svc_url()}/snapshots/{doc.id}")
                print(f"  API:    {svc_url()}/api/v1/snapshots/{doc.id}")
                print(f"  export: {svc_url()}/api/v1/snapshots/{doc.id}/export", flush=True)
                stored.set()

        def svc_url() -> str:
            return f"http://{settings.host}:{svc.port}"

        svc.on_snapshot.append(on_snapshot)
        service_task = asyncio.create_task(svc.run())
        await svc.started.wait()
        print(f"flightrec demo: API {svc_url()}/api/v1  (snapshots page {svc_url()}/snapshots)", flush=True)
        print(f"simulated prefill-0 on :{pair.prefill.port}, decode-0 on :{pair.decode.port}; "
              f"ramp C1->C16 with ISL {pair.cfg.scenario.isl}, OSL {pair.cfg.scenario.osl}", flush=True)  # fmt: skip
        if pair.frontend is not None:
            print(f"replay target: http://127.0.0.1:{pair.decode.port} (/v1/completions; no built-in load)", flush=True)
        sim_task = asyncio.create_task(pair.run())
        rc = 0
        if args.exit_after_snapshot:
            try:
                await asyncio.wait_for(stored.wait(), timeout=120)
                await asyncio.sleep(settings.snapshot_settle_s + 0.5)  # let the late evidence amend it
            except asyncio.TimeoutError:
                print("flightrec demo: no snapshot within 2 minutes", file=sys.stderr)
                rc = 1
            svc.request_stop()
        await service_task
        sim_task.cancel()
        await asyncio.gather(sim_task, return_exceptions=True)
        await pair.close()
        return rc

    return asyncio.run(run())


def _db(args: argparse.Namespace, settings: Settings) -> int:
    from collector.storage.db import StorageError
    from collector.storage.migrate import current, downgrade, upgrade

    try:
        if args.action == "upgrade":
            upgrade(settings.database, args.revision or "head")
        elif args.action == "downgrade":
            downgrade(settings.database, args.revision or "base")
        print(f"database at revision {current(settings.database) or 'base'}")
    except StorageError as exc:
        print(f"flightrec: {exc}", file=sys.stderr)
        return 1
    return 0


def _snapshots(args: argparse.Namespace, settings: Settings) -> int:
    import socket

    from collector.storage.db import StorageError, make_engine
    from collector.storage.repo import Repository, SnapshotFilter

    repo = Repository(make_engine(settings.database), host=settings.host_name or socket.gethostname())
    try:
        if args.action == "list":
            rows, _ = repo.list_snapshots(SnapshotFilter(engine=args.engine), limit=args.limit)
            print(f"{'id':>5}  {'created (UTC)':19}  {'host':16} {'engine':14} {'trigger':15} {'steps':>6} {'reqs':>7}  message")
            for r in rows:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["created_at"]))
                print(f"{r['id']:>5}  {when}  {r['host'][:16]:16} {r['engine'][:14]:14} {r['trigger_kind'][:15]:15} "
                      f"{r['step_count']:>6} {r['request_rows']:>7}  {r['trigger_message'][:70]}")  # fmt: skip
            return 0
        if args.id is None:
            print(f"flightrec: snapshots {args.action} needs an ID", file=sys.stderr)
            return 2
        doc = repo.get_snapshot(args.id)
        if args.action == "show":
            out = {k: v for k, v in doc.to_export().items() if k not in ("steps", "requests", "gpu_samples", "log_lines")}
            out["events"] = [{k: e.get(k) for k in ("ts", "kind", "source", "process", "xid", "message")} for e in doc.events]
            out["counts"] = {k: len(doc.part(k)) for k in ("steps", "requests", "gpu_samples", "events", "log_lines")}
            print(json.dumps(out, indent=2, default=str))
            return 0
        import gzip

        path = Path(args.output or f"flightrec-snapshot-{args.id}.json.gz")
        path.write_bytes(gzip.compress(json.dumps(doc.to_export(), default=str).encode()))
        print(f"wrote {path}")
        return 0
    except StorageError as exc:
        print(f"flightrec: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
