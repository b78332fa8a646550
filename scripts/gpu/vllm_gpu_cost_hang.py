#!/usr/bin/env python3
"""The recorder's cost under an open-loop load, and a real GPU hang, on one GPU. Each run ends
within ``--end-by`` (default: 570 s after its start) whatever happens, writing what it has.

    python3 scripts/gpu/vllm_gpu_cost_hang.py --out DIR --phases cost hang --shape 1b
    python3 scripts/gpu/vllm_gpu_cost_hang.py --out DIR --phases cost --shape auto

Phase ``cost``: R (the recorder: stat-logger plugin + RecordingScheduler) and N (none of this
package) started together on the one GPU with the same memory, the sidecar watching both alike
(scrapes, NVML, an Alertmanager-shaped receiver on loopback). After a warm-up, each server's
capacity: a closed loop at the concurrency the KV cache holds, its lanes staggered. Then rounds:
in each, one load level runs on R and on N in turn (ABBA order over a level's rounds), with the
very same Poisson arrivals (rate = the level's fraction of the mean capacity, fixed prompt and
output lengths, token-id prompts, ``ignore_eos``); per run, output tokens/s, p99 TTFT (from the
planned arrival) and p99 inter-token latency over its steady window, and the CPU its API server
and engine core spent. Levels 0.5, 0.8, 0.95 of capacity (the latencies and tokens/s), and 1.2
(above capacity: the queue grows, so its tokens/s are each server's own throughput: the one
figure that tells a 2% slower server apart when the load is below both servers' capacity).
Rounds go first to the level with fewest (up to ``--min-rounds``), then to the level whose widest
interval is furthest from +-``--target``, until all are within it or the time is spent. The ratio
R/N of each figure: the geometric mean of the round ratios, its 95% interval from Student's t
on the log-ratios (the bootstrap's beside it), the goal's verdict (tokens/s >= 0.98, p99 TTFT
and ITL <= 1.02).

Phase ``hang``: on R (N left idle), with requests running, the drill plugin launches a kernel
that spins on the model's stream inside a step; the engine core blocks in its next
synchronisation with the GPU. Watched: vLLM's /health (200 throughout), NVML's utilisation, the
engine core's stack (py-spy, by this script, as a witness of its own), and from the sidecar: the
wedge event, the hang snapshot (the engine core's stack, NVML's view), the page, the engine's
state. The kernel is released (the engine resumes: the event, the state back to ok, the
requests complete), fired again and left hung, and the engine is killed. Timings: last step ->
event -> snapshot -> page.

Shapes (dummy weights, no tokenizer): ``1b`` (the ~1.1B of the earlier runs), ``8b`` (Llama 3
8B's shape), ``14b`` (Llama-shaped, ~14.5B: two fit an H200 with room for their KV caches, not an
H100), ``auto`` (14b where the GPU has 120 GiB or more, else 8b; a 32B does not fit twice on one
GPU with room for its cache). ``--smoke`` runs the whole script on vLLM's CPU build with a tiny
model, the hang as a block in Python: it tests the script, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
from cost_phase import phase_cost  # noqa: E402
from gpu_run import SHUTDOWN_S, Run  # noqa: E402
from gpu_shapes import gpu_total_gib, nvidia_smi, plan_memory  # noqa: E402
from gpu_tier_lib import REPO, Receiver, log, machine_facts, probe_site, start_sidecar, start_vllm, stop, wait_http  # noqa: E402
from hang_phase import HANG_REST_S, phase_hang  # noqa: E402
from vllm_gpu_tier import Checks, drop_rings, rings_dir  # noqa: E402


def find_py_spy(sites: list[Path], python: str) -> str | None:
    """py-spy from the bundle (a ``--target`` install puts the wheel's binary in SITE/bin),
    beside the interpreter, or on PATH."""
    path = os.pathsep.join([*(str(s / "bin") for s in sites), str(Path(python).parent), os.environ.get("PATH", "")])
    return shutil.which("py-spy", path=path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--phases", nargs="+", choices=["cost", "hang"], default=["cost"])
    ap.add_argument("--shape", choices=["auto", "1b", "8b", "14b"], default="1b")
    ap.add_argument("--end-by", type=float, default=None, help="wall time (epoch s) by which the run has ended (default: start + 570)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/flightrec-gpu-tier"), help="logs, rings, databases")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that has vLLM (default: this one)")
    ap.add_argument("--site", type=Path, action="append", default=[], help="folders to add to PYTHONPATH after this checkout")
    ap.add_argument("--startup-s", type=float, default=300.0)
    ap.add_argument("--levels", type=float, nargs="+", default=[0.5, 0.8, 0.95, 1.2], help="fractions of the measured capacity")
    ap.add_argument("--isl", type=int, default=512)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=6.0, help="each run's length (arrivals); its first --warm-s not counted")
    ap.add_argument("--warm-s", type=float, default=1.5)
    ap.add_argument("--warmup-s", type=float, default=4.0, help="the warm-up loop on each server")
    ap.add_argument("--drain-s", type=float, default=30.0, help="longest wait for a run's requests after its last arrival")
    ap.add_argument("--gap-s", type=float, default=0.3, help="pause between runs")
    ap.add_argument("--capacity-concurrency", type=int, default=0, help="0: what 90%% of the KV cache holds, at most 256")
    ap.add_argument("--target", type=float, default=0.015, help="interval half-width at which a level is done")
    ap.add_argument("--min-rounds", type=int, default=4)
    ap.add_argument("--max-rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--no-raw", action="store_true", help="leave each request's own figures out of the JSON")
    ap.add_argument("--hang-lanes", type=int, default=16)
    ap.add_argument(
        "--hang-hold-s", type=float, default=30.0, help="longest wait for the wedge's event, snapshot (with its stacks) and page before the release"
    )
    ap.add_argument("--hang-settle-s", type=float, default=4.0)
    ap.add_argument("--smoke", action="store_true", help="vLLM's CPU build, a tiny model, short runs: the script's own test")
    args = ap.parse_args()
    t_start = time.time()
    end_by = args.end_by or t_start + 570.0
    for site in args.site:
        sys.path.append(str(site))
    if args.smoke:  # a CPU streams tens of tokens a second: short requests, few of them
        args.isl, args.osl = min(args.isl, 32), min(args.osl, 12)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, end_by)
    run.watchdog()
    for phase in args.phases:
        run.results[phase] = {"phase": phase}
        run.checks[phase] = Checks()
    code = 0
    procs: list[Any] = []
    recorder_dir: Path | None = None
    try:
        gpu = nvidia_smi()
        mem = plan_memory(args.shape, gpu_total_gib(gpu), args.smoke)
        log(f"GPU: {gpu}; model {mem['shape']} ({mem['why']}); {run.left():.0f} s to the end")
        for phase in args.phases:
            run.results[phase].update(model=mem, started=t_start, end_by=end_by)
        work = args.work / f"costhang-{mem['shape']}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        model = work / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(mem["config"]))
        site = probe_site(work / "probe-site")
        sys.path.insert(0, str(site))
        pp = [REPO, site, *args.site]
        recorder_dir = rings_dir(work, "costhang")
        recv = Receiver()
        fire = work / "r.fire"
        # the drill's hook in both servers (each step looks for its file: the same in R and N);
        # N's file never appears. No probe timings: the witness costs the engine too.
        servers = []
        t_servers = time.monotonic()
        names = ["R", "N"] if "cost" in args.phases else ["R"]
        for name in names:
            env = {
                "FLIGHTREC_DRILL_FIRE": str(fire if name == "R" else work / "n.never"),
                "FLIGHTREC_DRILL_KIND": "block" if args.smoke else "spin",
                "FLIGHTREC_DRILL_SPIN_MAX_S": str(max(120.0, 2 * args.hang_hold_s + 30)),  # each spin ends by itself after this
            }
            if name == "R":
                env["FLIGHTREC_RECORDER_DIR"] = str(recorder_dir)
            s = start_vllm(
                name,
                args.python,
                model,
                work,
                pp,
                recorder=name == "R",
                probe=True,
                env=env,
                kv_cache_bytes=mem["kv_bytes"],
                gpu_util=mem["gpu_util"],
            )
            servers.append(s)
            procs.append(s.proc)
            run.procs.append(s.proc)
            run.logs.append(s.log_path)
        py_spy = find_py_spy(args.site, args.python)
        path_env = os.pathsep.join([*(str(s / "bin") for s in args.site), os.environ.get("PATH", "")])
        os.environ["PATH"] = path_env  # the sidecar's stack capture finds py-spy on it
        side = start_sidecar(args.python, work, pp, servers, recorder_dir, alertmanager=recv.url, gpu=not args.smoke)
        procs.append(side.proc)
        run.procs.append(side.proc)
        run.logs.append(side.log_path)
        facts = machine_facts(args.python)  # versions: an import of vLLM, while the servers start
        log(f"machine: {facts}")
        for phase in args.phases:
            run.results[phase]["machine"] = facts
        startup = {}
        for s in servers:  # seconds from their start (together) to each one's first /health 200
            wait_http(f"{s.base}/health", s.proc, min(args.startup_s, run.left() - 30), f"vLLM {s.name}")
            startup[s.name] = round(time.monotonic() - t_servers, 1)
        log(f"servers healthy: {startup}; {run.left():.0f} s to the end")
        for phase in args.phases:
            run.results[phase]["startup_s"] = startup
        r = servers[0]
        if "cost" in args.phases:
            reserve = SHUTDOWN_S + (args.hang_hold_s + HANG_REST_S if "hang" in args.phases else 0.0)
            try:
                phase_cost(args, run, r, servers[1], side, mem, reserve)
            except Exception:  # noqa: BLE001 - its figures so far are written all the same
                run.results["cost"]["error"] = traceback.format_exc()
                log(run.results["cost"]["error"])
                run.checks["cost"].check("cost: phase ran to its end", False)
            run.save("cost")
        if "hang" in args.phases:
            # N stays up, idle (no GPU work): stopping it here would put an engine's death into
            # the sidecar's record (a page, an incident) just before the hang it is to show
            run.results["hang"]["started_in_run_s"] = round(time.time() - t_start, 1)
            try:
                phase_hang(args, run, r, side, recv, fire, py_spy)
            except Exception:  # noqa: BLE001
                run.results["hang"]["error"] = traceback.format_exc()
                log(run.results["hang"]["error"])
                run.checks["hang"].check("hang: phase ran to its end", False)
            run.save("hang")
    except Exception:  # noqa: BLE001 - the start failed: say so in every phase's file
        err = traceback.format_exc()
        log(err)
        for phase in args.phases:
            run.results[phase]["error"] = err
            run.checks[phase].check(f"{phase}: servers started", False)
    finally:
        for p in reversed(procs):
            stop(p)
        for key in ("launch1", "launch2"):  # the spin flags in /dev/shm outlive a killed engine
            flag = (run.results.get("hang", {}).get(key) or {}).get("flag")
            if flag:
                Path(flag).unlink(missing_ok=True)
        if recorder_dir is not None:
            drop_rings(recorder_dir)
    for phase in args.phases:
        run.results[phase]["seconds"] = round(time.time() - t_start, 1)
        run.save(phase)
        failed = run.checks[phase].failed
        log(f"{phase}: {len(run.checks[phase].items) - len(failed)} of {len(run.checks[phase].items)} checks passed; failed: {failed}")
        code = code or (1 if failed else 0)
    run.copy_logs()
    return code


if __name__ == "__main__":
    sys.exit(main())
