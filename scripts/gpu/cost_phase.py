"""Phase ``cost`` of the GPU tier: the recorder's cost, R against N, under an open-loop load
(scripts/gpu/vllm_gpu_cost_hang.py says how; open_loop.py is the load, paired_stats.py the
statistics)."""

from __future__ import annotations

import argparse
import math
import time
import urllib.error
from typing import Any

import open_loop as ol
import paired_stats as ps
from gpu_run import Run
from gpu_shapes import capacity_concurrency
from gpu_tier_lib import Sidecar, Vllm, cpu_seconds, cpu_us_per_token, log
from hang_contract import HANG_EVENT, hang_events


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
