"""Internal: ``flightrec replay``: drive an OpenAI-compatible endpoint with the load recorded before a crash.

    flightrec replay SNAPSHOT_ID --target URL [--speed X] [--model NAME] [--db URL | --sidecar URL]
    flightrec replay --plan SNAPSHOT_ID
    flightrec replay --from-file export.json.gz --target URL

The snapshot is read from ``--from-file`` (an export, from another site), else from the sidecar
named by ``--sidecar``, else from the database. After the replay, the snapshot the target's
sidecar stored (``--sidecar``, else the database) is named, and linked from the original.
Exit codes: 0 the replay ran (the engine died or not: the output says which), 1 the snapshot,
the target or the sidecar could not be read, 2 bad arguments, 130 interrupted (after the table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httpx

from collector.replay import report, source
from collector.replay.compare import Comparison, compare
from collector.replay.driver import Driver, ReplayResult, target_model
from collector.replay.plan import Plan, PlanError, build_plan
from collector.settings import Settings

SNAPSHOT_WAIT_S = 30.0  # after a death: how long the sidecar gets to commit its snapshot


def add_parser(sub: Any, parents: list[argparse.ArgumentParser] | None = None) -> None:
    # parents: -v/-q after the subcommand, as every other one takes them
    p = sub.add_parser("replay", parents=parents or [], help="replay the load recorded before a crash against an OpenAI-compatible endpoint")
    p.add_argument("id", nargs="?", type=int, metavar="SNAPSHOT_ID")
    p.add_argument("--plan", action="store_true", help="print the plan and send nothing")
    p.add_argument("--target", help="base URL of the OpenAI-compatible server (vLLM, a P/D proxy)")
    p.add_argument("--speed", type=float, default=1.0, help="arrival offsets divided by this (default 1)")
    p.add_argument("--model", help="model name to send (default: the target's first /v1/models entry)")
    p.add_argument("--sidecar", help="sidecar URL: read the snapshot there, and find the replay's snapshot there")
    p.add_argument("--from-file", type=Path, help="a snapshot export (.json.gz) instead of an id")
    p.add_argument("--seed", type=int, help="prompt content seed (default: the clock)")
    p.add_argument("--vocab", type=int, default=1000, help="token ids are drawn below this (default 1000)")
    p.add_argument("--timeout", type=float, help="per-request read timeout in seconds (default none)")
    p.add_argument("--json", action="store_true", help="print the plan (with --plan) or the result as JSON")
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--db", dest="database", help="database URL")


def _load(args: argparse.Namespace, settings: Settings) -> tuple[dict[str, Any], str]:
    """The snapshot export, and where it came from ("file", "sidecar", "db")."""
    if args.from_file is not None:
        return source.from_file(args.from_file), "file"
    if args.id is None:
        raise _Usage("replay needs a SNAPSHOT_ID or --from-file")
    if args.sidecar:
        return source.from_sidecar(args.sidecar, args.id, token=_token(settings)), "sidecar"
    return source.from_db(settings.database, args.id, host=_host(settings)), "db"


class _Usage(ValueError):
    pass


def _token(settings: Settings) -> str | None:
    return settings.api_token.get_secret_value() if settings.api_token is not None else None


def _host(settings: Settings) -> str:
    return settings.host_name or socket.gethostname()


def main(args: argparse.Namespace, settings: Settings) -> int:
    try:
        snap, origin = _load(args, settings)
        plan = build_plan(snap.get("workload"), source={"id": snap.get("id"), "engine": snap.get("engine"), "host": snap.get("host")})
    except _Usage as exc:
        print(f"flightrec: {exc}", file=sys.stderr)
        return 2
    except (source.ReplaySourceError, PlanError) as exc:
        print(f"flightrec: {exc}", file=sys.stderr)
        return 1
    if args.plan:
        print(json.dumps(report.plan_dict(plan), indent=2) if args.json else report.plan_text(plan))
        return 0
    if not args.target:
        print("flightrec: replay needs --target URL (or --plan)", file=sys.stderr)
        return 2
    if args.speed <= 0 or args.vocab < 12:
        print("flightrec: --speed must be positive and --vocab at least 12", file=sys.stderr)
        return 2
    return asyncio.run(_replay(args, settings, snap, origin, plan))


async def _replay(args: argparse.Namespace, settings: Settings, snap: dict[str, Any], origin: str, plan: Plan) -> int:
    async with httpx.AsyncClient(timeout=10.0) as probe:
        # nothing listening is no engine to replay against: said now, not read as a death later
        try:
            await probe.get(args.target.rstrip("/") + "/v1/models")
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            print(f"flightrec: nothing answers at {args.target} ({type(exc).__name__}: {exc}); is the engine up?", file=sys.stderr)
            return 1
        except httpx.HTTPError:
            pass  # it answers, if badly: the replay says what it can
        model = args.model or await target_model(probe, args.target) or _fingerprint_model(snap)
    if model is None:
        print(f"flightrec: {args.target} names no model (/v1/models) and the snapshot none: give --model", file=sys.stderr)
        return 1
    driver = Driver(
        plan, target=args.target, model=model, speed=args.speed, seed=args.seed, token_range=(10, args.vocab), request_timeout=args.timeout
    )
    tty = sys.stdout.isatty() and not args.json
    progress = report.TtyProgress(sys.stdout) if tty else report.LineProgress(sys.stderr if args.json else sys.stdout)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, driver.stop.set)
    if not args.json:
        print(
            f"replaying {len(plan.requests)} requests in {len(plan.phases)} phases against {args.target} (model {model}, speed {args.speed:g})",
            flush=True,
        )
    ticker = asyncio.create_task(_tick(driver, progress, 0.5 if tty else 2.0))
    try:
        result = await driver.run()
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        progress.close()
        loop.remove_signal_handler(signal.SIGINT)
    new_snap = None
    if not result.interrupted:
        new_snap = await _find_snapshot(args, settings, snap, origin, result)
    link = _link(args, settings, snap, origin, plan, result, new_snap)
    cmp = _compare(args, settings, plan, new_snap)
    if args.json:
        out = _as_json(plan, result, new_snap, link)
        out["comparison"] = (
            cmp
            if not isinstance(cmp, Comparison)
            else {
                "same": cmp.same,
                "same_prompts": cmp.same_prompts,
                "same_max_tokens": cmp.same_max_tokens,
                "same_concurrency": cmp.same_concurrency,
                "same_fault_point": cmp.same_fault_point,
                "notes": cmp.notes,
            }
        )
        print(json.dumps(out, indent=2))
    else:
        print(report.result_table(plan, result))
        print(report.verdict_text(plan, result, new_snap))
        if link:
            print(link)
        if isinstance(cmp, Comparison):
            print(report.comparison_text(cmp))
        elif cmp:
            print(cmp)
    return 130 if result.interrupted else 0


async def _tick(driver: Driver, progress: report.Progress, every: float) -> None:
    while True:
        progress.update(driver.result, driver.now())
        await asyncio.sleep(every)


def _fingerprint_model(snap: dict[str, Any]) -> str | None:
    fp = snap.get("fingerprint") or {}
    value = fp.get("served_model_name") or fp.get("model")
    return str(value) if value else None


async def _find_snapshot(
    args: argparse.Namespace, settings: Settings, snap: dict[str, Any], origin: str, result: ReplayResult
) -> dict[str, Any] | None:
    # a sidecar commits within a second of the fault; without a death only an already stored
    # snapshot is reported (an anomaly's, a manual one)
    wait = SNAPSHOT_WAIT_S if result.died else 0.0
    exclude = snap.get("id") if origin != "file" else None
    engine = snap.get("engine") if isinstance(snap.get("engine"), str) else None
    if args.sidecar:
        return await source.new_snapshot_from_sidecar(
            args.sidecar, result.started_at, wait_s=wait, token=_token(settings), exclude=exclude, engine=engine
        )
    if origin == "db" or args.database:
        return await source.new_snapshot_from_db(
            settings.database, result.started_at, host=_host(settings), wait_s=wait, exclude=exclude, engine=engine
        )
    return None


def _compare(args: argparse.Namespace, settings: Settings, plan: Plan, new_snap: dict[str, Any] | None) -> Comparison | str | None:
    """The replay's workload, as its engine recorded it, against the original's (or why not)."""
    if new_snap is None or new_snap.get("id") is None:
        return None
    try:
        if args.sidecar:
            again = source.from_sidecar(args.sidecar, int(new_snap["id"]), token=_token(settings))
        else:
            again = source.from_db(settings.database, int(new_snap["id"]), host=_host(settings))
        return compare(plan, build_plan(again.get("workload")))
    except (source.ReplaySourceError, PlanError) as exc:
        return f"the replayed workload was not compared: {exc}"


def _link(
    args: argparse.Namespace, settings: Settings, snap: dict[str, Any], origin: str, plan: Plan, result: ReplayResult, new_snap: dict[str, Any] | None
) -> str | None:
    """Link the replay from the original: through the sidecar the original came from (it serves
    the link at once), else in the database when we can write it."""
    if new_snap is None or snap.get("id") is None or not (origin in ("sidecar", "db") or args.database):
        return None
    entry = {
        "snapshot_id": new_snap.get("id"),
        "ts": result.started_at,
        "target": args.target,
        "speed": args.speed,
        "died": result.died,
        "died_phase": result.died_phase,
        "died_concurrency": plan.phases[result.died_phase - 1].concurrency if result.died_phase else None,
        "done_before_death": result.done_before_death,
    }
    refused = ""
    if origin == "sidecar":
        try:
            source.link_replay_via_sidecar(args.sidecar, int(snap["id"]), entry, token=_token(settings))
            return f"linked from snapshot {snap['id']} (summary.replays)"
        except source.ReplaySourceError as exc:
            if not args.database:
                return f"not linked: {exc}"
            refused = f"; the sidecar did not take it ({exc}), so its page shows it once its cached copy expires"
    try:
        source.link_replay(settings.database, int(snap["id"]), entry, host=_host(settings))
    except source.ReplaySourceError as exc:
        return f"not linked: {exc}"
    return f"linked from snapshot {snap['id']} (summary.replays) in the database{refused}"


def _as_json(plan: Plan, result: ReplayResult, new_snap: dict[str, Any] | None, link: str | None) -> dict[str, Any]:
    return {
        "source": plan.source,
        "died": result.died,
        "died_phase": result.died_phase,
        "died_at": result.died_at,
        "done_before_death": result.done_before_death,
        "interrupted": result.interrupted,
        "elapsed": result.elapsed,
        "errors": result.errors,
        "output_tokens": result.output_tokens,
        "phases": [
            {
                "phase": r.number,
                "concurrency": r.concurrency,
                "planned": r.planned,
                "sent": r.sent,
                "done": r.done,
                "failed": r.failed,
                "not_sent": r.not_sent,
                "seconds": r.seconds,
                "original_done": p.original("finished"),
                "original_failed": p.original_failed,
            }
            for p, r in zip(plan.phases, result.phases, strict=True)
        ],
        "original_crash_phase": plan.crash_phase.number if plan.crash_phase else None,
        "new_snapshot": new_snap,
        "linked": link,
    }
