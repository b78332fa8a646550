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

Phase ``hang``: on R (N stopped first), with requests running, the drill plugin launches a kernel
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
import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
import open_loop as ol  # noqa: E402
import paired_stats as ps  # noqa: E402
from gpu_tier_lib import (  # noqa: E402
    LLAMA_1B,
    LLAMA_TINY,
    REPO,
    Receiver,
    Result,
    Sidecar,
    Vllm,
    _one,
    cmdline,
    cpu_seconds,
    cpu_us_per_token,
    descendants,
    get_json,
    log,
    machine_facts,
    probe_site,
    start_sidecar,
    start_vllm,
    stop,
    wait_http,
)
from vllm_gpu_tier import Checks, drop_rings, rings_dir  # noqa: E402

# ---- shapes ---------------------------------------------------------------------------------------

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": LLAMA_TINY,
    "1b": LLAMA_1B,
    "8b": {
        **LLAMA_1B,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "14b": {
        **LLAMA_1B,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
}


def params(cfg: dict[str, Any]) -> int:
    """Parameters of a Llama shape (untied embeddings, norms left out: under 0.01%)."""
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return 2 * v * h + L * (h * q + 2 * h * kv + q * h + 3 * h * i)


def kv_bytes_per_token(cfg: dict[str, Any]) -> int:
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 2  # K and V, bf16


def gpu_total_gib(gpu_line: str) -> float | None:
    """GPU memory from ``nvidia-smi --query-gpu=name,driver_version,memory.total,...`` (MiB)."""
    m = re.search(r",\s*(\d+)\s*MiB", gpu_line or "")
    return int(m.group(1)) / 1024 if m else None


def plan_memory(shape: str, total_gib: float | None, smoke: bool) -> dict[str, Any]:
    """The shape (``auto`` resolved by the GPU's memory) and each server's memory: two servers
    share the GPU, each with ``gpu_util`` of it (vLLM's start-up check) and an explicit KV cache
    (vLLM's profiling of two engines starting together on one GPU would each see the other's
    allocations): the KV cache is what is left of that share after the weights and 6 GiB for
    activations, CUDA graphs and the CUDA context, at most 24 GiB."""
    if smoke:
        cfg = SHAPES["tiny"]
        return {"shape": "tiny", "config": cfg, "params_b": round(params(cfg) / 1e9, 4), "gpu_util": 0.25, "kv_bytes": 64 * 1024**2, "why": "smoke"}
    why = f"--shape {shape}"
    if shape == "auto":
        if total_gib is None:
            raise RuntimeError("--shape auto needs the GPU's memory (nvidia-smi gave none)")
        shape = "14b" if total_gib >= 120 else "8b"
        why = f"auto: {total_gib:.0f} GiB GPU memory -> {shape} (14b from 120 GiB: two copies with their KV caches; a 32B does not fit twice)"
    cfg = SHAPES[shape]
    n_params = params(cfg)
    if shape == "1b":  # the earlier runs' memory, unchanged
        return {"shape": shape, "config": cfg, "params_b": round(n_params / 1e9, 3), "gpu_util": 0.25, "kv_bytes": 16 * 1024**3, "why": why}
    util = 0.45
    weights_gib = n_params * 2 / 1024**3
    budget = (total_gib or 80.0) * util
    kv_gib = min(24.0, budget - weights_gib - 6.0)
    if kv_gib < 4.0:
        raise RuntimeError(f"shape {shape} ({weights_gib:.1f} GiB of weights) leaves {kv_gib:.1f} GiB of KV cache in {budget:.1f} GiB: too little")
    return {
        "shape": shape,
        "config": cfg,
        "params_b": round(n_params / 1e9, 3),
        "weights_gib": round(weights_gib, 2),
        "gpu_util": util,
        "kv_bytes": int(kv_gib * 1024**3),
        "why": why,
    }


def capacity_concurrency(kv_bytes: int, cfg: dict[str, Any], isl: int, osl: int, most: int = 256) -> int:
    """Concurrency of the capacity loop: what 90% of the KV cache holds at full length (no
    preemption), at most ``most``."""
    tokens = kv_bytes // kv_bytes_per_token(cfg)
    return max(1, min(most, int(0.9 * tokens / (isl + osl))))


_NUMBER_LIST = re.compile(r"\[\n\s+((?:-?[0-9.eE+-]+|null|true|false)(?:,\n\s+(?:-?[0-9.eE+-]+|null|true|false))*)\n\s*\]")


def dumps(body: Any) -> str:
    """JSON indented for reading, with lists of plain numbers on one line (each request's own
    figures would otherwise take a line a number)."""
    text = json.dumps(body, indent=1, default=str)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


# ---- the run's clock and its last resort ----------------------------------------------------------


class Run:
    """What the watchdog writes if the run must end at ``end_by``: each phase's result so far,
    and the processes to stop."""

    def __init__(self, out: Path, end_by: float) -> None:
        self.out, self.end_by = out, end_by
        self.results: dict[str, dict[str, Any]] = {}
        self.checks: dict[str, Checks] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.end_by - time.time()

    def save(self, phase: str) -> None:
        with self.lock:
            checks = self.checks.get(phase) or Checks()
            body = {**self.results.get(phase, {}), "checks": checks.items, "failed": checks.failed}
            tmp = self.out / f".gpu-tier-{phase}.json.tmp"
            tmp.write_text(dumps(body))
            tmp.replace(self.out / f"gpu-tier-{phase}.json")

    def copy_logs(self, limit: int = 3_000_000) -> None:
        for path in self.logs:
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, path.stat().st_size - limit))
                    (self.out / path.name).write_bytes(f.read())
            except OSError:
                pass

    def watchdog(self) -> None:
        def run() -> None:
            while self.left() > 3.0:
                time.sleep(0.5)
            log("end-by reached: writing what there is, stopping every process of this run")
            for phase, res in list(self.results.items()):
                res["cut_at_end_by"] = True
                try:
                    self.save(phase)
                except Exception:  # noqa: BLE001 - last resort: keep going
                    pass
            for p in self.procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.copy_logs()
            os._exit(3)

        threading.Thread(target=run, daemon=True, name="end-by").start()


# ---- phase cost -----------------------------------------------------------------------------------

SHUTDOWN_S = 25.0  # the end of a run: stopping servers and the sidecar, the JSON, the logs
# the hang phase besides its first hold: the load coming up, the return (at most 15 s), the
# second hang (30 s), the kill, the verdicts
HANG_REST_S = 75.0


def measured(s: Vllm, core: int | None, args: argparse.Namespace, seconds: float, warm_s: float, load: Any) -> dict[str, Any]:
    """One server's run: ``load()`` (results, start), the figures of its steady window, and the
    CPU its API server and engine core spent per output token."""
    cpu0 = (cpu_seconds(s.proc.pid), cpu_seconds(core))
    t_wall = time.monotonic()
    results, t0 = load()
    cpu1 = (cpu_seconds(s.proc.pid), cpu_seconds(core))
    summary = ol.summarise(results, t0, warm_s, seconds, raw=not args.no_raw)
    tokens = sum(r.tokens for r in results if r.ok)
    for key, c0, c1 in (("api", cpu0[0], cpu1[0]), ("core", cpu0[1], cpu1[1])):
        summary[f"cpu_s_{key}"] = None if c0 is None or c1 is None else round(c1 - c0, 3)
        summary[f"cpu_us_per_token_{key}"] = cpu_us_per_token(c0, c1, tokens)
    summary["wall_s"] = round(time.monotonic() - t_wall, 2)
    summary["mean_latency_s"] = ol.mean_latency(results)
    # under capacity a server delivers what is offered (about 1); above, its own throughput (< 1)
    offered = (summary.get("offered_req_s") or 0) * args.osl
    summary["delivered_over_offered"] = round(summary["tok_s"] / offered, 4) if offered and summary.get("tok_s") is not None else None
    return summary


def open_run(s: Vllm, core: int | None, args: argparse.Namespace, arrivals: list[ol.Arrival], tag: str, procs: int) -> dict[str, Any]:
    return measured(
        s, core, args, args.seconds, args.warm_s, lambda: ol.run_open(s.base, s.model, arrivals, args.isl, args.osl, tag, procs, drain_s=args.drain_s)
    )


def closed_run(
    s: Vllm, core: int | None, args: argparse.Namespace, conc: int, first: int, seconds: float, warm_s: float, stagger: float, tag: str, procs: int
) -> dict[str, Any]:
    return measured(
        s,
        core,
        args,
        seconds,
        warm_s,
        lambda: ol.run_closed_staggered(s.base, s.model, conc, first, args.isl, args.osl, seconds, stagger, tag, procs),
    )


OPEN_METRICS = ("tok_s", "ttft_p99_ms", "itl_p99_ms")
REPORTED = (*OPEN_METRICS, "ttft_p50_ms", "itl_p50_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p99_ms", "cpu_us_per_token_api", "cpu_us_per_token_core")


def level_metrics(frac: float) -> tuple[str, ...]:
    """The figures whose intervals decide a level: above capacity only tokens/s (its latencies
    grow with the queue for as long as the run lasts)."""
    return OPEN_METRICS if frac < 1.0 else ("tok_s",)


def ratios(pairs: list[dict[str, Any]], levels: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for frac in levels:
        rows = [p for p in pairs if p["level"] == frac]
        key = f"{frac:g}"
        out[key] = {"rounds": len(rows), "decides": list(level_metrics(frac))}
        for name in ("R", "N"):  # did the load stay under (about 1) or go over (below 1) capacity
            xs = sorted(p[name]["delivered_over_offered"] for p in rows if p[name].get("delivered_over_offered") is not None)
            out[key][f"delivered_over_offered_{name}"] = xs[len(xs) // 2] if xs else None
        for metric in REPORTED:
            r = [p["R"].get(metric) for p in rows]
            n = [p["N"].get(metric) for p in rows]
            out[key][metric] = ps.estimate(r, n, metric, seed=len(rows))
    return out


def needs(pairs: list[dict[str, Any]], levels: list[float], target: float) -> dict[str, float]:
    out = {}
    for frac in levels:
        rows = [p for p in pairs if p["level"] == frac]
        metrics = level_metrics(frac)
        out[f"{frac:g}"] = ps.need({m: [p["R"].get(m) for p in rows] for m in metrics}, {m: [p["N"].get(m) for p in rows] for m in metrics}, target)
    return out


def phase_cost(args: argparse.Namespace, run: Run, r: Vllm, n: Vllm, side: Sidecar, mem: dict[str, Any], reserve_s: float) -> None:
    checks = run.checks["cost"]
    res = run.results["cost"]
    cfg = mem["config"]
    conc = args.capacity_concurrency or capacity_concurrency(mem["kv_bytes"], cfg, args.isl, args.osl)
    if args.smoke:
        conc = min(conc, 4)
    core = {s.name: s.engine_core_pid() for s in (r, n)}
    res["load"] = {
        "isl": args.isl,
        "osl": args.osl,
        "seconds": args.seconds,
        "warm_s": args.warm_s,
        "levels": args.levels,
        "capacity_concurrency": conc,
        "target_half_width": args.target,
        "min_rounds": args.min_rounds,
        "max_rounds": args.max_rounds,
        "seed": args.seed,
        "interval": "Student's t on the paired round log-ratios (primary, decides the rounds); percentile bootstrap over rounds beside it",
    }
    since = time.time()
    # -- warm-up and capacity --------------------------------------------------------------------
    log(f"cost: warm-up, then capacity (closed loop at {conc}, lanes staggered)")
    procs = 1 if args.smoke else 8
    latency: dict[str, float] = {}
    for s in (r, n):
        w = closed_run(s, core[s.name], args, conc, 50_000_000, args.warmup_s, args.warmup_s / 2, 0.0, "warm-", procs)
        latency[s.name] = round(w.get("mean_latency_s") or 1.0, 3)
    cap: dict[str, Any] = {}
    for s in (r, n):
        # lanes start spread over one request's time; counted once they all run
        stagger = latency[s.name]
        seconds = max(args.seconds, stagger + 5.0)
        cap[s.name] = closed_run(s, core[s.name], args, conc, 60_000_000, seconds, stagger + 1.0, stagger, "cap-", procs)
        log(f"cost: capacity {s.name}: {cap[s.name]['tok_s']} tokens/s at concurrency {conc}")
    req_s = [c["tok_s"] / args.osl for c in cap.values() if c.get("tok_s")]
    if len(req_s) < 2:
        raise RuntimeError(f"capacity not measured: {cap}")
    capacity = sum(req_s) / len(req_s)
    res["capacity"] = {
        "concurrency": conc,
        "stagger_s": latency,
        "R": cap["R"],
        "N": cap["N"],
        "req_s_R": round(req_s[0], 3),
        "req_s_N": round(req_s[1], 3),
        "req_s_used": round(capacity, 3),
        "ratio_tok_s_R_over_N": round(req_s[0] / req_s[1], 4),
    }
    rates = {f: f * capacity for f in args.levels}
    res["rates_req_s"] = {f"{f:g}": round(x, 3) for f, x in rates.items()}
    run.save("cost")
    # -- rounds ----------------------------------------------------------------------------------
    deadline = run.end_by - reserve_s
    res["measure_deadline_in_s"] = round(deadline - time.time(), 1)
    pairs: list[dict[str, Any]] = []
    res["pairs"] = pairs
    rounds = {f"{f:g}": 0 for f in args.levels}
    pair_s: dict[str, float] = {}
    stopped = None
    t_measure = time.monotonic()
    while True:
        need = needs(pairs, args.levels, args.target)
        pick = ps.next_level(need, rounds, min_rounds=args.min_rounds, max_rounds=args.max_rounds)
        if pick is None:
            stopped = "every level within its target or at its most rounds"
            break
        est = pair_s.get(pick, 2 * (args.seconds + 4.0))
        if time.time() + est > deadline:
            stopped = f"time: the next pair ({pick}, about {est:.0f} s) would pass the deadline"
            break
        frac = float(pick)
        k = rounds[pick]
        seed = args.seed * 100_000 + args.levels.index(frac) * 1000 + k
        first = 1_000_000 * (len(pairs) + 1)
        arrivals = ol.poisson_schedule(rates[frac], args.seconds, seed, first_index=first)
        nprocs = 1 if args.smoke else ol.client_procs(rates[frac] * args.osl)
        order = ps.abba(k)
        t_pair = time.monotonic()
        pair: dict[str, Any] = {
            "level": frac,
            "round": k,
            "order": list(order),
            "seed": seed,
            "rate_req_s": round(rates[frac], 3),
            "arrivals": len(arrivals),
        }
        for name in order:
            s = r if name == "R" else n
            pair[name] = open_run(s, core[name], args, arrivals, f"L{pick}-{k}-", nprocs)
            time.sleep(args.gap_s)
        pair["wall_s"] = round(time.monotonic() - t_pair, 2)
        pair_s[pick] = pair["wall_s"] + 1.0
        pairs.append(pair)
        rounds[pick] += 1
        log(
            f"cost: level {pick} round {k + 1} ({'/'.join(order)}): tok/s R/N {pair['R']['tok_s']}/{pair['N']['tok_s']}, "
            f"p99 TTFT {pair['R']['ttft_p99_ms']}/{pair['N']['ttft_p99_ms']} ms, p99 ITL {pair['R']['itl_p99_ms']}/{pair['N']['itl_p99_ms']} ms "
            f"[{pair['wall_s']} s, {run.left():.0f} s left]"
        )
        res["ratios"] = ratios(pairs, args.levels)
        run.save("cost")
    res["stopped"] = stopped
    res["measuring_s"] = round(time.monotonic() - t_measure, 1)
    res["ratios"] = ratios(pairs, args.levels)
    res["needs"] = {k: (None if math.isinf(v) else round(v, 3)) for k, v in needs(pairs, args.levels, args.target).items()}
    log(f"cost: stopped ({stopped}) after {len(pairs)} pairs in {res['measuring_s']} s")
    for key, lv in res["ratios"].items():
        log(
            "cost: level "
            + key
            + ": "
            + ", ".join(f"{m} {lv[m]['ratio']} {lv[m]['ci95_t']} {lv[m].get('verdict')}" for m in level_metrics(float(key)))
        )
    # -- validity of the measurement (the goals themselves are in ratios, not checks) -----------
    segs = [p[s] for p in pairs for s in ("R", "N")]
    checks.check("cost: at least one round of every level", all(v > 0 for v in rounds.values()), rounds)
    checks.check(
        "cost: every request of every run completed", all(x["errors"] == 0 for x in segs), [x["error_kinds"] for x in segs if x["errors"]][:3]
    )
    checks.check(
        "cost: every request's chunks carried its token counts, summing to its usage (tokens/s counts tokens, not chunks)",
        all(x["requests_with_token_counts"] == x["completed"] and x["usage_matches_chunks"] for x in segs),
        {"tokens_per_chunk_max": max((x["tokens_per_chunk"] for x in segs), default=None)},
    )

    lags = [x["lag_p99_ms"] for x in segs if x["lag_p99_ms"] is not None]
    checks.check(
        "cost: the client sent on its schedule (p99 lag under 5 ms in every run)",
        bool(lags) and max(lags) < 5.0,
        {"worst_p99_lag_ms": max(lags, default=None)},
    )
    sustained = [
        (p["level"], s, p[s]["in_flight"])
        for p in pairs
        if p["level"] < 1.0
        for s in ("R", "N")
        if p[s]["in_flight"]["end"] > 2 * p[s]["in_flight"]["start"] + 8
    ]
    checks.check("cost: the loads under capacity were sustained (no queue growing through the window)", not sustained, sustained[:4])
    try:
        wedged = [e for e in hang_events(side, None, since) if e.get("kind") == HANG_EVENT]
        checks.check("cost: no wedge reported while both engines served and idled in turn", not wedged, wedged[:2])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        checks.check("cost: the sidecar's events readable", False, repr(exc))


# ---- what the hang detector and the stack capture expose: the one place that reads them ---------
# (event kinds in collector/model.py; engines' ``state``; the snapshot's stacks; the page's name)

HANG_EVENT, RESUME_EVENT, HANG_ALERT = "engine_wedged", "engine_resumed", "VllmEngineWedged"


def hang_events(side: Sidecar, engine: str | None, since: float) -> list[dict[str, Any]]:
    """Wedge and resume events since ``since`` (of ``engine``, or of every engine)."""
    q = "/events?limit=500" + (f"&engine={engine}" if engine else "")
    items = side.api(q).get("items") or []
    found = [e for e in items if e.get("kind") in (HANG_EVENT, RESUME_EVENT) and (e.get("ts") or 0) >= since - 1]
    return sorted(found, key=lambda e: e.get("ts") or 0)


def engine_state(side: Sidecar, engine: str) -> dict[str, Any]:
    """The engine's verdict: ``state`` (ok, wedged, down, gpu_fault) and since when, with the
    sidecar's own step count beside it (empty when the sidecar did not answer)."""
    try:
        rows = side.api("/engines")
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    e = next((x for x in rows if x.get("name") == engine), {})
    return {k: e.get(k) for k in ("state", "state_since", "since", "stuck_seconds", "steps_received", "last_step", "running", "waiting")}


def wedge_snapshots(side: Sidecar, engine: str, since: float) -> list[dict[str, Any]]:
    items = side.api(f"/snapshots?engine={engine}").get("items") or []
    found = [s for s in items if s.get("trigger_kind") == HANG_EVENT and (s.get("created_at") or 0) >= since - 1]
    return sorted(found, key=lambda s: s.get("created_at") or 0)


def _walk(x: Any) -> Any:
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def snapshot_hang_view(doc: dict[str, Any], since: float) -> dict[str, Any]:
    """From a hang snapshot: its stacks' status, the engine core's entry (the process whose
    role, title or name says engine core), whether it waits in a GPU synchronisation (its
    blocking frame where the capture names one, else any frame of it), and NVML's view of the
    GPU (the stacks' own readings, else the snapshot's GPU samples taken after ``since``)."""
    stacks = doc.get("stacks")
    out: dict[str, Any] = {
        "has_stacks": bool(stacks),
        "stacks_status": stacks.get("status") if isinstance(stacks, dict) else None,
        "stacks_reasons": (stacks.get("reasons") if isinstance(stacks, dict) else None) or None,
    }
    core: dict[str, Any] | None = None
    for d in _walk(stacks):
        labels = " ".join(str(d.get(k) or "") for k in ("role", "title", "name", "process", "cmdline"))
        if "engine_core" in labels or "EngineCore" in labels:
            core = d
            break
    blocking = (core or {}).get("blocking") or {}
    frame = blocking.get("frame") if isinstance(blocking, dict) else None
    text = json.dumps(core) if core is not None else (json.dumps(stacks) if stacks else "")
    out["engine_core_found"] = core is not None
    out["engine_core_state"] = (core or {}).get("state")
    out["engine_core_blocking_frame"] = frame
    if isinstance(frame, dict) and frame.get("function"):
        out["engine_core_in_sync"] = bool(SYNC.search(str(frame.get("function"))))
    else:
        out["engine_core_in_sync"] = bool(SYNC.search(text))
    out["engine_core_excerpt"] = _sync_excerpt(text)
    utils = [d.get(k) for d in _walk(stacks) for k in ("utilization", "utilization_gpu", "gpu_util", "util") if isinstance(d.get(k), (int, float))]
    samples = [s.get("utilization") for s in doc.get("gpu_samples") or [] if (s.get("ts") or 0) >= since and s.get("utilization") is not None]
    out["nvml_util_in_stacks"] = utils[:8]
    out["nvml_util_in_samples_after_launch"] = samples[-8:]
    out["nvml_busy"] = any(u >= 90 for u in utils) or any(u >= 90 for u in samples)
    return out


SYNC = re.compile(r"synchroni[sz]e|cudaEventSynchronize|cudaStreamSynchronize|cuEventSynchronize|cuStreamSynchronize")


def _sync_excerpt(text: str, width: int = 600) -> str | None:
    m = SYNC.search(text)
    if not m:
        return text[:width] or None
    return text[max(0, m.start() - width // 2) : m.start() + width // 2]


def pages(recv: Receiver, since: float, snapshot_id: int | None) -> list[tuple[float, dict[str, Any]]]:
    """Alerts received since ``since`` that page the wedge (by name, or by the snapshot's link)."""
    out = []
    for ts, a in recv.alerts():
        if ts < since:
            continue
        body = json.dumps(a)
        if (a.get("labels") or {}).get("alertname") == HANG_ALERT or (snapshot_id is not None and f"/snapshots/{snapshot_id}" in body):
            out.append((ts, a))
    return out


# ---- phase hang -----------------------------------------------------------------------------------


def health(base: str) -> tuple[int | None, float]:
    t = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
            return resp.status, round(1000 * (time.monotonic() - t), 1)
    except urllib.error.HTTPError as exc:
        return exc.code, round(1000 * (time.monotonic() - t), 1)
    except (urllib.error.URLError, OSError):
        return None, round(1000 * (time.monotonic() - t), 1)


class Nvml:
    """GPU 0's utilisation, for this script's own view (None where NVML is not there)."""

    def __init__(self, on: bool) -> None:
        self.read: Any = None
        if not on:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.read = lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as exc:  # noqa: BLE001 - unknown, not zero
            log(f"NVML not readable here: {exc!r}")

    def util(self) -> int | None:
        try:
            return None if self.read is None else self.read()
        except Exception:  # noqa: BLE001
            return None


def py_spy_dump(py_spy: str | None, pid: int | None) -> dict[str, Any]:
    """This script's own look at a process's Python stacks (``--nonblocking``: never paused)."""
    if not py_spy or pid is None:
        return {"error": "no py-spy" if not py_spy else "no pid"}
    t = time.monotonic()
    try:
        p = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": repr(exc)}
    text = p.stdout + (p.stderr if p.returncode else "")
    return {
        "rc": p.returncode,
        "ms": round(1000 * (time.monotonic() - t), 1),
        "in_sync": bool(SYNC.search(text)),
        "text": text[-20000:],
    }


def main_thread(text: str | None, frames: int = 8) -> list[str] | None:
    """The top frames of a py-spy dump's main thread (its first thread: the engine core's busy
    loop), innermost first."""
    if not text:
        return None
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith("Thread ") and "MainThread" in x), None)
    if start is None:
        return None
    out = []
    for x in lines[start + 1 :]:
        if not x.startswith(" "):
            break
        out.append(x.strip())
    return out[:frames]


def engine_processes(r: Vllm) -> dict[str, int]:
    """The engine core and its workers (a worker of its own on the CPU build or with TP > 1;
    with TP=1 on a GPU the engine core runs the model itself)."""
    out: dict[str, int] = {}
    for pid in descendants(r.proc.pid):
        cmd = cmdline(pid)
        if "EngineCore" in cmd:
            out["engine_core"] = pid
        elif "VLLM::Worker" in cmd:
            out[f"worker_{len([k for k in out if k.startswith('worker')])}"] = pid
    return out


def look_twice(py_spy: str | None, procs: dict[str, int]) -> dict[str, Any]:
    """Each process's stacks, twice, 2 s apart, with its main thread's top frames each time."""
    first = {name: py_spy_dump(py_spy, pid) for name, pid in procs.items()}
    time.sleep(2.0)
    second = {name: py_spy_dump(py_spy, pid) for name, pid in procs.items()}
    out = {}
    for name, pid in procs.items():
        top, later = main_thread(first[name].get("text")), main_thread(second[name].get("text"))
        out[name] = {**first[name], "pid": pid, "main_thread": top, "main_thread_2s_later": later}
    return out


def watch_hang(
    args: argparse.Namespace, r: Vllm, side: Sidecar, recv: Receiver, nvml: Nvml, launched: float, until_all: bool, hold_s: float, py_spy: str | None
) -> dict[str, Any]:
    """Poll while the engine hangs: /health, NVML, the engine's state, wedge events, snapshots,
    pages; a py-spy dump of the engine core 3 s in. Returns when the event, the snapshot and the
    page are all seen (``until_all``) or only the event (else), or after ``hold_s``."""
    out: dict[str, Any] = {"health": [], "util": [], "states": [], "first_seen": {}}
    seen = out["first_seen"]
    t_end = time.time() + hold_s
    dumped = False
    while time.time() < t_end:
        now = time.time()
        code, ms = health(r.base)
        out["health"].append([round(now - launched, 2), code, ms])
        out["util"].append([round(now - launched, 2), nvml.util()])
        try:
            st = engine_state(side, r.name)
            out["states"].append([round(now - launched, 2), st.get("state"), st.get("steps_received")])
            if st.get("state") == "wedged" and "state_wedged" not in seen:
                seen["state_wedged"] = now
            ev = [e for e in hang_events(side, r.name, launched) if e.get("kind") == HANG_EVENT]
            if ev and "event" not in seen:
                seen["event"], out["event"] = now, ev[0]
            snaps = wedge_snapshots(side, r.name, launched)
            if snaps and "snapshot" not in seen:
                seen["snapshot"], out["snapshot"] = now, snaps[0]
            # the stacks come with the snapshot's amendment (its first commit says "reading")
            amended = next(
                (x for x in snaps if x.get("id") == (out.get("snapshot") or {}).get("id") and (x.get("summary") or {}).get("amended_at")), None
            )
            if amended and "amended" not in seen:
                seen["amended"], out["snapshot"] = now, amended
            got = pages(recv, launched, (out.get("snapshot") or {}).get("id"))
            if got and "page" not in seen:
                seen["page"], out["page"] = got[0][0], got[0][1]
        except (urllib.error.URLError, OSError, ValueError) as exc:
            out.setdefault("sidecar_errors", []).append(repr(exc)[:200])
        if not dumped and now - launched >= 3.0:  # two looks 2 s apart: a stuck thread does not move
            out["py_spy"] = look_twice(py_spy, engine_processes(r))
            dumped = True
        done = "event" in seen and (not until_all or ("amended" in seen and "page" in seen))
        if done and dumped:
            break
        time.sleep(0.25)
    return out


class Load:
    """Lanes of long requests on a server, each sending its next when the last ends, in a thread
    of this script, until ``stop()``: requests running when the kernel spins, and the witness
    that they complete after its release."""

    def __init__(self, r: Vllm, lanes: int, isl: int, osl: int) -> None:
        self.results: list[Result] = []
        self._stop = threading.Event()
        host, port = r.base.removeprefix("http://").split(":")

        async def lane(k: int) -> None:
            i = 70_000_000 + k
            while not self._stop.is_set():
                res = Result(index=i, prompt_len=isl, scheduled=time.time())
                self.results.append(res)
                await _one(host, int(port), r.model, i, isl, osl, "hang-", prompt=ol.unique_prompt(i, isl), res=res)
                if res.error:
                    await asyncio.sleep(0.5)  # the server gone: do not spin on refused connections
                i += lanes

        async def lanes_all() -> None:
            await asyncio.gather(*(lane(k) for k in range(lanes)))

        self.thread = threading.Thread(target=lambda: asyncio.run(lanes_all()), daemon=True, name="hang-load")
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def wait_launched(fire: Path, n: int, timeout: float = 30.0) -> dict[str, Any] | None:
    path = Path(str(fire) + ".launched")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rec = json.loads(path.read_text())
            if rec.get("n") == n:
                return dict(rec)
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    return None


def release(fire: Path, launch: dict[str, Any]) -> float:
    """Let the kernel end: 1 into its /dev/shm flag (from this process: the engine's own
    threads may all be blocked) and the release file its own watcher thread looks for."""
    import flightrec_spin  # the probe's module: on sys.path through probe_site

    t = time.time()
    if launch.get("flag"):
        flightrec_spin.release_file(str(launch["flag"]))
    Path(str(fire) + ".release").write_text("release")
    return t


def rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(1000 * (a - b), 1)


def phase_hang(args: argparse.Namespace, run: Run, r: Vllm, side: Sidecar, recv: Receiver, fire: Path, py_spy: str | None) -> None:
    checks = run.checks["hang"]
    res = run.results["hang"]
    nvml = Nvml(on=not args.smoke)
    kind = "block" if args.smoke else "spin"
    # requests of a few seconds: always some running when the kernel spins, and those that ran
    # through the first hang end before the second
    lanes, isl, osl = (4, 32, 48) if args.smoke else (args.hang_lanes, 256, 512)
    res.update(kind=kind, engine=r.name, load={"lanes": lanes, "isl": isl, "osl": osl}, py_spy=py_spy, hold_s=args.hang_hold_s)
    res["util_before"] = nvml.util()
    load = Load(r, lanes, isl, osl)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (engine_state(side, r.name).get("running") or 0) >= lanes - 1:
            break
        time.sleep(0.3)
    time.sleep(2.0)
    before = engine_state(side, r.name)
    res["before"] = before
    # -- 1. spin, watch, release -------------------------------------------------------------------
    fire.write_text("1")
    launch = wait_launched(fire, 1)
    res["launch1"] = launch
    if not checks.check(f"hang: the {kind} kernel was launched inside a step", launch is not None, None):
        return
    assert launch is not None
    lt = float(launch["ts"])
    # the first hang gets its hold unless the run's end is near: 60 s stay for the rest
    hold1 = max(10.0, min(args.hang_hold_s, run.left() - SHUTDOWN_S - 60.0))
    w1 = watch_hang(args, r, side, recv, nvml, lt, until_all=True, hold_s=hold1, py_spy=py_spy)
    res["hang1"] = w1
    t_rel = release(fire, launch)
    res["released_after_s"] = round(t_rel - lt, 2)
    # -- the return ----------------------------------------------------------------------------
    resumed: dict[str, Any] = {}
    deadline = time.monotonic() + 15
    steps_at = (w1["states"][-1][2] if w1["states"] else None) or 0
    while time.monotonic() < deadline:
        st = engine_state(side, r.name)
        now = time.time()
        if (st.get("steps_received") or 0) > steps_at and "steps_again" not in resumed:
            resumed["steps_again"] = now
        if st.get("state") == "ok" and "state_ok" not in resumed:
            resumed["state_ok"] = now
        try:
            ev = [e for e in hang_events(side, r.name, lt) if e.get("kind") == RESUME_EVENT]
        except (urllib.error.URLError, OSError, ValueError):
            ev = []
        if ev and "event" not in resumed:
            resumed["event"], resumed["event_body"] = now, ev[0]
        if {"steps_again", "state_ok", "event"} <= set(resumed):
            break
        time.sleep(0.25)
    flag1 = None
    if launch.get("flag"):
        import flightrec_spin

        flag1 = flightrec_spin.read_file(str(launch["flag"]))
    res["resume"] = {**resumed, "flag": flag1}
    time.sleep(args.hang_settle_s)
    # -- 2. spin again, leave it hung, kill the engine ----------------------------------------------
    fire.write_text("2")
    launch2 = wait_launched(fire, 2)
    res["launch2"] = launch2
    w2: dict[str, Any] = {}
    if launch2 is not None:
        hold2 = max(5.0, min(args.hang_hold_s, run.left() - SHUTDOWN_S - 15.0))
        w2 = watch_hang(args, r, side, recv, nvml, float(launch2["ts"]), until_all=False, hold_s=hold2, py_spy=py_spy)
    res["hang2"] = w2
    t_kill = time.time()
    stop(r.proc, grace=5.0)  # SIGTERM, then SIGKILL: a thread blocked in the driver runs no handler
    res["kill"] = {"exited_after_ms": rel(time.time(), t_kill), "returncode": r.proc.returncode}
    util_after = []
    for _ in range(10):
        util_after.append(nvml.util())
        if util_after[-1] is not None and util_after[-1] < 10:
            break
        time.sleep(1.0)
    res["util_after_kill"] = util_after
    load.stop()
    # -- verdicts ----------------------------------------------------------------------------------
    seen = w1["first_seen"]
    codes = [h[1] for h in w1["health"]]
    checks.check(
        "hang: vLLM's /health answered 200 all through the hang", len(codes) >= 3 and all(c == 200 for c in codes), sorted(set(codes), key=str)
    )
    if not args.smoke:
        busy = [u for t, u in w1["util"] if u is not None and t >= 2.0]  # NVML averages over up to 1 s
        checks.check("hang: NVML read the GPU busy (>= 90%) through the hang", bool(busy) and min(busy) >= 90, busy[:12])
    spy = w1.get("py_spy") or {}
    want = "synchronize" if not args.smoke else "_hang"
    stuck = [
        n for n, d in spy.items() if any(want in f for f in d.get("main_thread") or []) and d.get("main_thread") == d.get("main_thread_2s_later")
    ]
    res["stuck_in"] = stuck
    checks.check(
        f"hang: the engine's main thread (py-spy, this script) waits in {want}, the same 2 s later",
        bool(stuck),
        {n: {k: d.get(k) for k in ("rc", "ms", "error", "main_thread")} for n, d in spy.items()},
    )
    checks.check("hang: the sidecar reported the wedge (engine_wedged)", "event" in seen, None)
    checks.check("hang: the engine's state was wedged during the hang", "state_wedged" in seen, [s[1] for s in w1["states"]][-5:])
    snap = w1.get("snapshot")
    view: dict[str, Any] = {}
    stacks_of: Any = None
    if snap:
        doc = get_json(f"{side.base}/api/v1/snapshots/{snap['id']}", timeout=60, token=side.token)
        view = snapshot_hang_view(doc, lt)
        stacks_of = doc.get("stacks")
        steps = doc.get("steps") or []
        res["snapshot_view"] = {**view, "steps": len(steps), "last_step": max((s["step"] for s in steps), default=None)}
        last_ts = max((s.get("ts") or 0 for s in steps), default=None) or None
    else:
        last_ts = None
    checks.check("hang: a snapshot triggered by the wedge", snap is not None, None)
    if args.smoke:  # the CPU build runs the model in a worker process: the block is there
        checks.check(
            "hang: the snapshot holds the blocked step's stack (the drill's _hang)", "_hang" in json.dumps(stacks_of), view.get("stacks_status")
        )
    else:
        checks.check(
            "hang: the snapshot holds the engine core's stack at the synchronisation point",
            bool(view.get("engine_core_in_sync")),
            {k: view.get(k) for k in ("stacks_status", "stacks_reasons", "engine_core_state", "engine_core_blocking_frame")},
        )
    if not args.smoke:
        checks.check(
            "hang: the snapshot holds NVML's view of the busy GPU", bool(view.get("nvml_busy")), view.get("nvml_util_in_samples_after_launch")
        )
    checks.check("hang: the page reached the receiver", "page" in seen, [(a.get("labels") or {}).get("alertname") for _, a in recv.alerts()][-5:])
    checks.check(
        "hang: released, the engine stepped again, said so (engine_resumed) and its state went back to ok",
        {"steps_again", "state_ok", "event"} <= set(resumed),
        sorted(resumed),
    )
    # the requests that were streaming when the kernel spun: tokens again after the release
    across = [x for x in load.results if x.chunks and x.chunks[0] < lt and any(t > t_rel for t in x.chunks)]
    res["load_results"] = {
        "requests": len(load.results),
        "completed": sum(1 for x in load.results if x.ok),
        "streaming_at_the_hang_and_after_the_release": len(across),
        "of_those_completed": sum(1 for x in across if x.ok),
        "errors": sorted({str(x.error)[:120] for x in load.results if x.error})[:3],
    }
    checks.check(
        "hang: requests streaming when the kernel spun streamed again after the release",
        bool(across),
        res["load_results"],
    )
    if not args.smoke and flag1 is not None:
        checks.check("hang: the kernel ended by its release (not its time limit)", flag1.get("ended") == "released", flag1)
    seen2 = w2.get("first_seen") or {}
    checks.check("hang: fired again and left hung, the wedge was reported again", "event" in seen2, sorted(seen2))
    if not args.smoke:
        checks.check("hang: the engine killed, the GPU idle again (NVML < 10%)", any(u is not None and u < 10 for u in util_after), util_after)
    ev = w1.get("event") or {}
    res["timings_ms"] = {
        "launch_to_event": rel(ev.get("ts"), lt),
        "launch_to_event_seen": rel(seen.get("event"), lt),
        "launch_to_state_wedged_seen": rel(seen.get("state_wedged"), lt),
        "launch_to_snapshot_committed": rel((snap or {}).get("created_at"), lt),
        "launch_to_page_received": rel(seen.get("page"), lt),
        "last_step_to_launch": rel(lt, last_ts),
        "last_step_to_event": rel(ev.get("ts"), last_ts),
        "last_step_to_snapshot_committed": rel((snap or {}).get("created_at"), last_ts),
        "last_step_to_page_received": rel(seen.get("page"), last_ts),
        "release_to_steps_again_seen": rel(resumed.get("steps_again"), t_rel),
        "release_to_resumed_event_seen": rel(resumed.get("event"), t_rel),
        "release_to_state_ok_seen": rel(resumed.get("state_ok"), t_rel),
        "second_launch_to_event_seen": rel(seen2.get("event"), (launch2 or {}).get("ts")),
    }
    log(f"hang timings: {res['timings_ms']}")


# ---- the run --------------------------------------------------------------------------------------


def nvidia_smi() -> str:
    """The GPU's name, driver, memory (MiB) and bus id; the error where there is none."""
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return repr(exc)


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
            if len(servers) > 1:
                stop(servers[1].proc)  # the hang is R's alone on the GPU
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
