"""Where an engine with the recorder spends its CPU, against one without: sampled stacks of
both vLLM servers' engine core and API server under the same closed-loop load.

    python3 scripts/gpu/profile_recorder.py --out DIR --py-spy PATH [--levels 1 64] [--seconds 8]

Starts R (the recorder: stat-logger plugin + RecordingScheduler, rings in /dev/shm) and N (none
of this package) on the model of ``vllm_gpu_tier.py``, no probe and no sidecar (nothing but vLLM
and the recorder runs in them); at each concurrency, for each server in turn, a closed loop of
``--seconds`` while ``py-spy record --nonblocking`` (the processes are never paused) samples
the engine core and the API server for all but the loop's first and last second. Writes one
raw collapsed-stack file per server, level and process (``<server>-c<level>-<core|api>.txt``,
threads apart; all in ``stacks.tgz`` at the end), each run's tokens/s and CPU seconds (``profile.json``), and prints the shares
of the stacks that pass through this package, by process. Finishes in about 4 minutes on an
H200 (the servers' start is most of it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_tier_lib import (  # noqa: E402
    REPO,
    cpu_seconds,
    cpu_us_per_token,
    log,
    machine_facts,
    run_for,
    run_load,
    start_vllm,
    stop,
    wait_http,
    window,
    write_model,
)

# The recorder's hooks in vLLM's own methods: their frames sit above vLLM's work (super().schedule()
# runs under RecordingScheduler.schedule), so a sample under them alone is vLLM's, not ours.
HOOKS = ("RecordingScheduler.", "FlightRecorderStatLogger.record ", "guarded ")


def _own(frame: str) -> bool:
    return "collector/" in frame and not frame.startswith(HOOKS)


def shares(raw: Path) -> dict[str, Any]:
    """Samples in a raw py-spy file, and the share whose stack runs the recorder's own code: a
    frame of this package below its hooks into vLLM (reading the requests, encoding, writing the
    ring), counted by the outermost such frame."""
    total = 0
    ours = 0
    by_fn: dict[str, int] = {}
    try:
        lines = raw.read_text(errors="replace").splitlines()
    except OSError:
        return {"error": f"no {raw.name}"}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        total += n
        mine = [f for f in stack.split(";") if _own(f)]
        if mine:
            ours += n
            key = mine[0].split(" (")[0]
            by_fn[key] = by_fn.get(key, 0) + n
    top = sorted(by_fn.items(), key=lambda kv: -kv[1])[:8]
    return {"samples": total, "recorder_share": round(ours / total, 4) if total else None, "top": top}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--py-spy", required=True, help="the py-spy binary")
    ap.add_argument("--work", type=Path, default=Path("/tmp/flightrec-gpu-profile"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--site", type=Path, action="append", default=[])
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--startup-s", type=float, default=300.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    model = write_model(args.work / "model")
    pp = [REPO, *args.site]
    rings = Path("/dev/shm") / f"flightrec-gpu-profile-{os.getpid()}"
    result: dict[str, Any] = {"machine": machine_facts(args.python), "runs": []}
    procs: list[Any] = []
    try:
        r = start_vllm("R", args.python, model, args.work, pp, recorder=True, probe=False, env={"FLIGHTREC_RECORDER_DIR": str(rings)})
        n = start_vllm("N", args.python, model, args.work, pp, recorder=False, probe=False)
        procs += [r.proc, n.proc]
        for s in (r, n):
            wait_http(f"{s.base}/health", s.proc, args.startup_s, f"vLLM {s.name}")
        for s in (r, n):
            run_load(s.base, s.model, [(900_000 + i, 512) for i in range(32)], 64, 16, "warm-", procs=2)
        pids = {s.name: {"api": s.proc.pid, "core": s.engine_core_pid()} for s in (r, n)}
        result["pids"] = pids
        seq = 0
        for c in args.levels:
            for s in (r, n) if c % 2 == 0 else (n, r):
                seq += 1
                spies = []
                for role, pid in pids[s.name].items():
                    if pid is None:
                        continue
                    f = args.out / f"{s.name}-c{c}-{role}.txt"
                    cmd = [args.py_spy, "record", "--nonblocking", "--threads", "--pid", str(pid), "--rate", str(args.rate)]
                    cmd += ["--duration", str(int(args.seconds - 2)), "--format", "raw", "--output", str(f)]
                    spies.append(subprocess.Popen(["sh", "-c", f"sleep 1; exec {' '.join(cmd)}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
                cpu0 = {k: cpu_seconds(p) for k, p in pids[s.name].items()}
                res, t0 = run_for(s.base, s.model, 1_000_000 * seq, 512, 256, c, args.seconds, f"p{c}-", procs={1: 1, 16: 2, 64: 4}.get(c, 8))
                cpu1 = {k: cpu_seconds(p) for k, p in pids[s.name].items()}
                errs = []
                for sp in spies:
                    try:
                        _, err = sp.communicate(timeout=30)
                        if sp.returncode:
                            errs.append(err.decode(errors="replace")[-500:])
                    except subprocess.TimeoutExpired:
                        sp.kill()
                        errs.append("py-spy did not finish")
                w = window(res, t0 + 1.0, t0 + args.seconds)
                tokens = sum(x.tokens for x in res if x.ok)
                run = {
                    "server": s.name,
                    "concurrency": c,
                    **w,
                    "cpu_us_per_token": {k: cpu_us_per_token(cpu0[k], cpu1[k], tokens) for k in cpu0},
                    "py_spy_errors": errs,
                    "shares": {role: shares(args.out / f"{s.name}-c{c}-{role}.txt") for role in ("core", "api")},
                }
                result["runs"].append(run)
                log(json.dumps(run)[:1500])
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(rings, ignore_errors=True)
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
        # one archive of the raw stacks: a copy back from a lent machine may take few files
        raws = sorted(args.out.glob("*-c*-*.txt"))
        if raws:
            subprocess.run(["tar", "-czf", str(args.out / "stacks.tgz"), "-C", str(args.out), *[f.name for f in raws]], check=False)
            for f in raws:
                f.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
