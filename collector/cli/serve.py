"""Internal: ``flightrec serve`` (the sidecar) and ``flightrec demo`` (the sidecar plus a simulated
prefill/decode pair that crashes like the incident)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from collector.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    add_settings_options,
    require_writable_database,
    settings_from,
    sqlite_path,
)
from collector.settings import Settings, SettingsError

DEMO_TIMEOUT_S = 120.0


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        parents=parents,
        help="run the sidecar",
        description="Run the sidecar: scrape the engines, follow the GPU and the logs, keep the last steps and commit a snapshot at every fault.",
    )
    add_settings_options(serve)
    serve.add_argument("--host", help="bind address; anything but loopback needs api_token (default: settings, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port, 0 for any free one (default: settings, 8787)")
    serve.add_argument(
        "--fleet",
        action="store_true",
        help="the fleet role: serve the API and pages (/fleet) over the shared store (database.shared, or database), "
        "watching no engine, GPU or kernel log of its own",
    )
    serve.set_defaults(func=run_serve)

    demo = sub.add_parser(
        "demo",
        parents=parents,
        help="the sidecar plus a simulated P/D pair that crashes like the incident",
        description="Run the sidecar against a simulated prefill/decode pair that ramps "
        "C1 -> C16 and dies with the incident's fault; prints each phase and the "
        "snapshot's URL.",
    )
    add_settings_options(demo)
    demo.add_argument("--port", type=int, help="HTTP port, 0 for any free one (default: settings, 8787)")
    demo.add_argument(
        "--exit-after-snapshot",
        action="store_true",
        help="exit 0 once the crash snapshot is stored (with --hang: once the wedge's snapshot is stored and the engine moved again, ok or idle)",
    )
    demo.add_argument(
        "--hang",
        action="store_true",
        help="a wedge instead of the crash: at the fault point the decode engine's step never ends (requests held, /health 200) "
        "for --hang-for seconds, then it moves again",
    )
    demo.add_argument("--hang-for", type=float, default=40.0, metavar="SECONDS", help="how long the wedge lasts (default 40)")
    demo.add_argument("--speed", type=float, default=1500.0, help="simulated engine steps per second")
    demo.add_argument("--serve-completions", action="store_true", help="no built-in load: the pair serves /v1/completions, for flightrec replay")
    demo.add_argument(
        "--workdir", default=None, help="folder for the simulated logs and rings, kept after exit (default: a temporary folder, removed at exit)"
    )
    demo.set_defaults(func=run_demo)


def fleet_role(settings: Settings) -> Settings:
    """The settings of ``serve --fleet``: the shared store as the only store (its partitions
    kept by this process too), no engine, no GPU, no kernel log, no recorder."""
    return settings.model_copy(
        update={"engines": [], "nvml": "off", "kmsg": "off", "recorder": "off", "database_split": False, "database_local": None, "alertmanager": []}
    )


def check_bind(settings: Settings) -> None:
    token = settings.api_token.get_secret_value().strip() if settings.api_token is not None else ""
    if not settings.loopback_only and not token:
        raise SettingsError(f"host: binding {settings.host} needs api_token (reads then require the token)")


def check_port_free(host: str, port: int) -> None:
    """Fail in one line before any work when the port is taken (uvicorn would log a
    traceback and exit 1 after the migrations ran)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CliError(f"cannot serve on {host}:{port}: the port is in use (pick another with --port)") from exc
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES):
                raise CliError(f"cannot serve on {host}:{port}: {exc.strerror}", EXIT_USAGE) from exc
            raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc


def _preflight(settings: Settings) -> None:
    check_bind(settings)
    require_writable_database(settings.database)
    if settings.spool_dir is not None:
        try:
            Path(settings.spool_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"spool_dir: cannot create {settings.spool_dir}: {exc.strerror or exc}", EXIT_USAGE) from exc
    check_port_free(settings.host, settings.port)


async def _run_service(svc: Any) -> None:
    from collector import heap

    async def freeze_when_started() -> None:
        await svc.started.wait()
        heap.freeze_startup()

    freezing = asyncio.create_task(freeze_when_started())
    try:
        await svc.run()
    except SystemExit as exc:  # the service's own "cannot serve" exit
        if exc.code in (None, 0):
            raise
        raise CliError(str(exc.code) if isinstance(exc.code, str) else "the HTTP server did not start", EXIT_FAILURE) from None
    finally:
        freezing.cancel()


def run_serve(args: argparse.Namespace) -> int:
    from collector import heap, malloc
    from collector.service import Service

    settings = settings_from(args, host=args.host, port=args.port)
    if getattr(args, "fleet", False):
        settings = fleet_role(settings)
    _preflight(settings)
    malloc.tune()  # before the rings and the threads allocate
    heap.tune()
    svc = Service(settings)
    asyncio.run(_run_service(svc))
    if svc.lost_snapshots:  # each logged at CRITICAL with its engine, trigger and time
        print(f"flightrec serve: {len(svc.lost_snapshots)} snapshot(s) lost at stop (see the log)", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def run_demo(args: argparse.Namespace) -> int:
    base = settings_from(args, port=args.port)
    _preflight(base)
    if args.workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="flightrec-demo-"))
        keep = False
    else:
        workdir = Path(args.workdir).resolve()
        keep = True
    recorder_dir = workdir / "recorder"
    if recorder_dir.is_dir():  # rings of an earlier demo run are history, not this pair
        for old in recorder_dir.glob("*.ring"):
            old.unlink()
    if base.spool_dir is None:  # the demo's spool is its own, not a folder left beside the database
        base = base.model_copy(update={"spool_dir": workdir / "spool"})
    db_file = sqlite_path(base.database)
    where = f"{db_file.resolve()} (kept: flightrec snapshots list --db {_safe(base.database)})" if db_file else _safe(base.database)
    print(
        f"flightrec demo: simulated logs, rings and spool in {workdir} "
        f"({'kept' if keep else 'removed at exit; --workdir DIR keeps them'}); database {where}",
        flush=True,
    )
    try:
        return asyncio.run(_demo(args, base, workdir, recorder_dir))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _safe(url: str) -> str:
    from collector.redact import redact_text

    return redact_text(url)


async def _phases(pair: Any) -> None:
    """Print each phase of the ramp as it passes: the demo is otherwise silent for ~30 s."""
    phases = pair.cfg.scenario.phases
    seen: int | None = None
    told_wedge = False
    while pair.crashed_at is None and pair.resumed_at is None:
        if pair.wedged_at is not None and not told_wedge:
            told_wedge = True
            print(
                f"  the decode engine wedged after step {pair.wedge_step}: its step never ends, {len(pair.decode.running)} requests held, "
                "/health 200 (for {:.0f} s)".format(pair.cfg.hang_s or 0),
                flush=True,
            )
        st = pair.status()
        idx = st.get("phase")
        if idx is not None and idx != seen and idx < len(phases):
            seen = idx
            print(
                f"  phase C{phases[idx].concurrency} ({idx + 1}/{len(phases)}): {st.get('done', 0)} requests done, "
                f"decode step {st.get('decode_step')}",
                flush=True,
            )
        await asyncio.sleep(0.25)
    if pair.resumed_at is not None and pair.wedged_at is not None:
        print(f"  the decode engine moved again after {pair.resumed_at - pair.wedged_at:.1f} s", flush=True)
    else:
        print(f"  the decode engine died at step {pair.crash_step} (Xid, both TP workers' CUDA errors, crash dump)", flush=True)


async def _demo(args: argparse.Namespace, base: Settings, workdir: Path, recorder_dir: Path) -> int:
    from collector.service import Service
    from collector.sim.pair import PairConfig, SimPair
    from collector.sources.nvml import NvmlSource

    hang = bool(getattr(args, "hang", False))
    pair = SimPair(
        PairConfig(
            workdir=workdir,
            recorder_dir=recorder_dir,
            steps_per_second=args.speed,
            serve_completions=args.serve_completions,
            hang_s=args.hang_for if hang else None,
        )
    )
    await pair.start()
    settings = base.model_copy(
        update={
            "engines": pair.engine_configs(),
            "recorder_dir": recorder_dir,
            "kmsg": str(pair.kmsg_path),
            "nvml": "off",
            "scrape_interval": min(base.scrape_interval, 1.0),
        }
    )
    svc = Service(settings, extra_sources=[NvmlSource(pair.nvml, interval=0.5)])
    stored = asyncio.Event()
    resumed = asyncio.Event()

    def url() -> str:
        return f"http://{settings.host}:{svc.port}"

    def on_snapshot(doc: Any, trigger: Any) -> None:
        if doc.engine == "decode-0" and not stored.is_set():
            what = "wedge" if trigger.kind.value == "engine_wedged" else "crash"
            print(f"{what} snapshot {doc.id} of {doc.engine} (trigger {trigger.kind.value}: {trigger.message[:160]})")
            print(f"  page:   {url()}/snapshots/{doc.id}")
            print(f"  API:    {url()}/api/v1/snapshots/{doc.id}")
            print(f"  export: {url()}/api/v1/snapshots/{doc.id}/export", flush=True)
            if not args.exit_after_snapshot:
                print("serving until Ctrl-C", flush=True)
            stored.set()

    svc.on_snapshot.append(on_snapshot)

    async def watch_state() -> None:
        """--hang: the decode engine's verdict as it changes (GET /api/v1/engines/decode-0/health)."""
        told = None
        while True:
            await asyncio.sleep(0.5)
            ctx = svc.ctx
            verdict = ctx.engine_health("decode-0") if ctx is not None else None
            if verdict is not None and verdict["state"] != told:
                if told is not None or verdict["state"] != "idle":
                    print(f"  decode-0 is {verdict['state']}: {verdict['reason']}", flush=True)
                # the wedge is over once the engine steps again: it holds requests and steps (ok),
                # or it has already finished the ones it held (idle) by the time this looks
                if told == "wedged" and verdict["state"] in ("ok", "idle"):
                    resumed.set()
                told = verdict["state"]

    service_task = asyncio.create_task(_run_service(svc))
    started = asyncio.create_task(svc.started.wait())
    await asyncio.wait({service_task, started}, return_when=asyncio.FIRST_COMPLETED)
    if service_task.done():
        started.cancel()
        await pair.close()
        service_task.result()  # raises the CliError
        return EXIT_FAILURE
    print(f"flightrec demo: API {url()}/api/v1  (snapshots page {url()}/snapshots)", flush=True)
    print(
        f"simulated prefill-0 on :{pair.prefill.port}, decode-0 on :{pair.decode.port}; "
        f"ramp C1->C16 with ISL {pair.cfg.scenario.isl}, OSL {pair.cfg.scenario.osl}",
        flush=True,
    )
    if pair.frontend is not None:
        print(f"replay target: http://127.0.0.1:{pair.decode.port} (/v1/completions; no built-in load)", flush=True)
    sim_task = asyncio.create_task(pair.run())
    phase_task = asyncio.create_task(_phases(pair))
    state_task = asyncio.create_task(watch_state()) if hang else None
    rc = 0
    if args.exit_after_snapshot:
        try:
            await asyncio.wait_for(stored.wait(), timeout=DEMO_TIMEOUT_S)
            await asyncio.sleep(settings.snapshot_settle_s + 0.5)  # let the late evidence amend it
            if hang:  # and the wedge's end: the engine steps again, its state back to ok
                await asyncio.wait_for(resumed.wait(), timeout=args.hang_for + 30.0)
        except TimeoutError:
            print(
                "flightrec: demo: no snapshot within 2 minutes" if not stored.is_set() else "flightrec: demo: the engine never moved again",
                file=sys.stderr,
            )
            rc = EXIT_FAILURE
        svc.request_stop()
    try:
        await service_task
    finally:
        others = [t for t in (sim_task, phase_task, state_task) if t is not None]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await pair.close()
    return rc
