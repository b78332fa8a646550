#!/usr/bin/env python3
"""The GPU tier: the recorder in a real vLLM OpenAI server on a real NVIDIA GPU, the sidecar
beside it, and real faults inside the engine. Each phase finishes within 10 minutes on an H200
and writes its figures and verdicts as JSON; the exit code is 1 when a check failed.

    python3 scripts/gpu/vllm_gpu_tier.py --phase recorder --out DIR   # 1 + 2: recorder, cost
    python3 scripts/gpu/vllm_gpu_tier.py --phase fault --out DIR      # 3: trap and illegal store

Needs vLLM 0.26+ with its CUDA build importable by ``--python`` (default: this interpreter),
CuPy (the drill's kernels), root for ``/dev/kmsg`` (else NVML alone witnesses the Xid). This
project is taken from the checkout the script lives in (put first on PYTHONPATH); the probe
plugin (scripts/gpu/probe) is made loadable from a folder of its own. Every process it starts
is its own; it changes no GPU setting and never resets the card.

Phase ``recorder``: three servers on the one GPU (a ~1.1B Llama shape with dummy weights, no
tokenizer, prompts as token ids): R with the recorder (stat-logger plugin + RecordingScheduler)
on vLLM's GPU defaults (async scheduling, CUDA graphs FULL_AND_PIECEWISE, the V2 model runner);
N without any of this package; G with the recorder on the V1 model runner, which reports the
CUDA graph each step ran (``--cudagraph-metrics``; the V2 runner reports none). The sidecar
watches R and G, joined by URL (no engine name anywhere). Checks 1: every step the engine
scheduled (counted by the probe, apart from the recorder) is stored; the scheduler is the async
one; per-request rows against what was sent and received; figures equal to what the stat logger
wrote, nulls where vLLM gave nothing; the graph mode per step where vLLM reports it. Then 2:
output tokens/s and inter-token latency, R against N, interleaved rounds at concurrency 1, 16,
64, 256; the recorder's import time and per-step time.

Phase ``fault``: two recorder engines (F1, F2) on the GPU, one sidecar with NVML, the kernel
log and an Alertmanager-shaped receiver on loopback; a ramp 1/2/4/8/16 of long outputs on F1,
then a ``trap`` launched inside a step (Xid 43); then a ramp on F2 and a store to an illegal
address (Xid 31). Checks: one Xid event from NVML and kmsg, routed to the faulted engine by pid;
vLLM's own error lines parsed; exactly one snapshot per fault with the steps up to it, request
rows, GPU samples and the fingerprint; the alert received; the other engine still recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # this checkout's collector (ring decoders)
from gpu_tier_lib import (  # noqa: E402
    REPO,
    Hist,
    LogWatch,
    Receiver,
    Sidecar,
    Vllm,
    cpu_seconds,
    cpu_us_per_token,
    get_json,
    hist_merge,
    hist_summary,
    log,
    machine_facts,
    post_json,
    probe_delta,
    probe_site,
    read_probe,
    run_for,
    run_load,
    start_sidecar,
    start_vllm,
    stop,
    wait_http,
    window,
    write_model,
)

PARTIAL: dict[str, Any] = {}  # what main() writes if the phase is cut short


def save(out: Path, phase: str, result: dict[str, Any], checks: Checks) -> None:
    body = {**PARTIAL, **result, "checks": checks.items, "failed": checks.failed}
    tmp = out / f".gpu-tier-{phase}.json.tmp"
    tmp.write_text(json.dumps(body, indent=1, default=str))
    tmp.replace(out / f"gpu-tier-{phase}.json")


class Checks:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: Any = None) -> bool:
        self.items.append({"check": name, "ok": bool(ok), "detail": detail})
        log(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail is not None and not ok else ""))
        return bool(ok)

    @property
    def failed(self) -> list[str]:
        return [c["check"] for c in self.items if not c["ok"]]


def stored_steps(db: Path, engine: str) -> dict[str, Any]:
    from collector.storage.steps import count_stored_steps  # noqa: PLC0415 - the chunks are decoded to count

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        row = con.execute(
            "SELECT MIN(c.first_step), MAX(c.last_step) FROM engine_step_chunks c JOIN engines e ON e.id = c.engine_id WHERE e.name = ?",
            (engine,),
        ).fetchone()
    finally:
        con.close()
    rows, distinct = count_stored_steps(f"sqlite:///{db}", engine=engine)
    return {"distinct": distinct, "min": row[0], "max": row[1], "rows": rows}


def wait_idle(side: Sidecar, engine: str, quiet_s: float = 3.0, limit: float = 60.0) -> None:
    last, since, t0 = None, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < limit:
        eng = next((e for e in side.engines() if e["name"] == engine), {})
        now = eng.get("steps_received")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.5)


def manual_snapshot(side: Sidecar, engine: str) -> dict[str, Any]:
    status, body = post_json(f"{side.base}/api/v1/snapshots", {"engine": engine, "reason": "gpu tier"}, side.token)
    if status not in (200, 201, 202) or not isinstance(body, dict):
        raise RuntimeError(f"manual snapshot: {status} {body}")
    sid = (body.get("ids") or [None])[0]
    deadline = time.monotonic() + 30
    while sid is None and time.monotonic() < deadline:
        items = side.api(f"/snapshots?engine={engine}")["items"]
        sid = items[0]["id"] if items else None
        time.sleep(0.5)
    if sid is None:
        raise RuntimeError("manual snapshot not stored")
    return get_json(f"{side.base}/api/v1/snapshots/{sid}", timeout=60)


def request_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cols = (doc.get("requests") or {}).get("columns") or {}
    names = list(cols)
    n = len(cols[names[0]]) if names else 0
    return [{k: cols[k][i] for k in names} for i in range(n)]


def stats_written(recorder_dir: Path, api_pid: int) -> dict[int, Any]:
    """The stat logger's records of the server ``api_pid`` as it wrote them (its ring), by step."""
    from collector.channel.codec import decode_many  # the project's own decoder
    from collector.channel.naming import parse_ring_file_name
    from collector.channel.ringfile import RingReader
    from collector.model import StepRecord

    out: dict[int, Any] = {}
    for path in recorder_dir.glob("*.stats.*.ring"):
        parsed = parse_ring_file_name(path.name)
        if parsed is None or parsed.engine != f"vllm-{api_pid}":
            continue
        for _, obs, _ in decode_many(list(RingReader(path).read()), engine=parsed.engine):
            if isinstance(obs, StepRecord):
                out[obs.step] = obs
    return out


# ---- phase 1 and 2 ------------------------------------------------------------------------


def rings_dir(work: Path, phase: str) -> Path:
    """Where the recorder's rings go: a folder of its own under /dev/shm, as in production (the
    recorder's default: a ring write is a store into RAM), when /dev/shm has room for every ring
    of the phase (256 MiB free); else the work folder, which the result names. A ring on a disk
    is written back by the kernel while the engine writes into it: not what users run."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 256 * 1024**2 and os.access("/dev/shm", os.W_OK):
            return Path("/dev/shm") / f"flightrec-gpu-tier-{phase}-{os.getpid()}"
    except OSError:
        pass
    return work / "recorder"


def drop_rings(recorder_dir: Path) -> None:
    """A /dev/shm folder holds RAM until removed: gone at the phase's end (a work folder stays)."""
    if recorder_dir.parent == Path("/dev/shm"):
        shutil.rmtree(recorder_dir, ignore_errors=True)


def phase_recorder(args: argparse.Namespace, out: Path, checks: Checks) -> dict[str, Any]:
    work = args.work / "recorder"
    work.mkdir(parents=True, exist_ok=True)
    model = write_model(work / "model", tiny=args.smoke)
    site = probe_site(work / "probe-site")
    pp = [REPO, site, *args.site]
    recorder_dir = rings_dir(work, "recorder")
    probe_r = work / "probe-R"
    probe_n = work / "probe-N"
    result: dict[str, Any] = {"phase": "recorder", "rings": str(recorder_dir)}
    procs: list[Any] = []
    kv = 64 * 1024**2 if args.smoke else 16 * 1024**3
    graph_args = [] if args.smoke else ["--cudagraph-metrics"]
    try:
        common = {"FLIGHTREC_RECORDER_DIR": str(recorder_dir)}
        r = start_vllm(
            "R",
            args.python,
            model,
            work,
            pp,
            recorder=True,
            probe=True,
            env={**common, "FLIGHTREC_PROBE_DIR": str(probe_r), "FLIGHTREC_PROBE_RECORDER": "1"},
            extra_args=graph_args,
            kv_cache_bytes=kv,
        )
        # N: the probe only counts its steps and times them (none of this package loads in vLLM)
        n = start_vllm(
            "N",
            args.python,
            model,
            work,
            pp,
            recorder=False,
            probe=True,
            env={"FLIGHTREC_PROBE_DIR": str(probe_n)},
            extra_args=graph_args,
            kv_cache_bytes=kv,
        )
        servers = [r, n]
        g = None
        if not args.no_graph_check:
            g = start_vllm(
                "G",
                args.python,
                model,
                work,
                pp,
                recorder=True,
                probe=False,
                env={**common, "VLLM_USE_V2_MODEL_RUNNER": "0"},
                extra_args=["--cudagraph-metrics"],
            )
            servers.append(g)
        procs += [s.proc for s in servers]
        # N is watched too (scrapes only): both servers of the cost comparison answer the same
        # /metrics scrapes, so the difference is the recorder's alone
        side = start_sidecar(args.python, work, pp, servers, recorder_dir, alertmanager=None, gpu=not args.smoke)
        procs.append(side.proc)
        startup = {}
        for s in servers:
            startup[s.name] = round(wait_http(f"{s.base}/health", s.proc, args.startup_s, f"vLLM {s.name}"), 1)
        result["startup_s"] = startup
        log(f"servers healthy: {startup}")

        # -- 1. the recorder on a GPU engine -------------------------------------------------
        sent = {i: 64 + 37 * i for i in range(48)}
        res = run_load(r.base, r.model, list(sent.items()), 192, 16, "gpu1-", procs=2)
        got = {x.index: x.tokens for x in res if x.ok}
        checks.check("phase 1: all 48 requests completed", len(got) == 48, sorted(set(sent) - set(got))[:5])
        if g is not None:
            run_load(g.base, g.model, [(i, 200 + 10 * i) for i in range(24)], 96, 8, "gpu1g-", procs=1)
        wait_idle(side, "R")
        time.sleep(2.0)  # one more write batch
        probe = read_probe(probe_r)
        steps = stored_steps(side.db, "R")
        result["steps"] = {"probe": {k: probe[k] for k in ("schedule_calls", "schedule_with_tokens", "files")}, "stored": steps}
        checks.check(
            "phase 1: every step the engine scheduled is stored (probe's count = stored steps 1..N)",
            steps["distinct"] == probe["schedule_calls"] and steps["min"] == 1 and steps["max"] == probe["schedule_calls"],
            {"probe": probe["schedule_calls"], "stored": steps},
        )
        engines = side.engines()
        result["engines"] = [{k: e.get(k) for k in ("name", "configured", "recorder", "steps_received")} for e in engines]
        want = sorted(s.name for s in servers)
        checks.check(
            "phase 1: one engine per configured server, joined with no engine name; N (no recorder) says so",
            sorted(e["name"] for e in engines) == want
            and all(
                e.get("configured") and (e.get("recorder") == "recording" if e["name"] != "N" else e.get("recorder") in ("missing", "none"))
                for e in engines
            ),
            result["engines"],
        )
        doc = manual_snapshot(side, "R")
        fp = doc.get("fingerprint") or {}
        result["fingerprint"] = {
            k: fp.get(k) for k in ("vllm_version", "scheduler_base", "async_scheduling", "cuda_graph_mode", "compilation_mode", "model")
        }
        checks.check(
            "phase 1: the recorder kept vLLM's AsyncScheduler",
            str(fp.get("scheduler_base", "")).endswith("AsyncScheduler") and fp.get("async_scheduling") is True,
            result["fingerprint"],
        )
        rows = request_rows(doc)
        by_req: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            m = re.search(r"gpu1-(\d{4})", str(row.get("request_id")))
            if m:
                by_req.setdefault(int(m.group(1)), []).append(row)
        bad_prompt = [i for i, rs in by_req.items() if any(x.get("prompt_len") != sent[i] for x in rs)]
        out_gap, comp_gap = [], []
        for i, rs in by_req.items():
            last = max(rs, key=lambda x: x["step"])
            if i in got:
                out_gap.append(got[i] - int(last.get("output_tokens") or 0))
                comp_gap.append(sent[i] + got[i] - int(last.get("computed_tokens") or 0))
        result["rows"] = {
            "requests_with_rows": len(by_req),
            "rows": len(rows),
            "received_minus_last_row_output": sorted(set(out_gap)),
            "prompt_plus_received_minus_last_row_computed": sorted(set(comp_gap)),
        }
        checks.check("phase 1: every request sent has rows", set(by_req) == set(sent), sorted(set(sent) - set(by_req))[:5])
        checks.check("phase 1: each row's prompt length is the one sent", not bad_prompt, bad_prompt[:5])
        # the last row is written when the last step is scheduled: its output tokens are those
        # received before it (the step's own token comes after), computed its prompt + those
        checks.check(
            "phase 1: last row's output and computed tokens within 2 of what the client received",
            bool(out_gap) and all(0 <= d <= 2 for d in out_gap) and all(0 <= d <= 2 for d in comp_gap),
            result["rows"],
        )
        cols = ((doc.get("workload") or {}).get("requests") or {}).get("columns") or {}
        wl = {}
        for rid, plen, olen in zip(cols.get("id", []), cols.get("prompt_len", []), cols.get("output_len", [None] * 10**6), strict=False):
            m = re.search(r"gpu1-(\d{4})", str(rid))
            if m:
                wl[int(m.group(1))] = (plen, olen)
        checks.check(
            "phase 1: the workload log has every request with its prompt length and output length",
            {i: v[0] for i, v in wl.items()} == sent and all(wl[i][1] == got[i] for i in got if i in wl),
            {"missing": sorted(set(sent) - set(wl))[:5], "wrong_output": [i for i in got if i in wl and wl[i][1] != got[i]][:5]},
        )
        # unknown is not zero: figures equal to what the stat logger wrote, nulls where it gave none
        written = stats_written(recorder_dir, r.proc.pid)
        mism, compared, nulls_ok = [], 0, True
        for s in doc.get("steps") or []:
            if not s.get("has_stats"):
                nulls_ok = nulls_ok and s.get("kv_cache_usage") is None and s.get("waiting") is None
                continue
            w = written.get(s["step"])
            if w is None:
                continue
            compared += 1
            for name in ("running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens", "generation_tokens"):
                if s.get(name) != getattr(w, name):
                    mism.append((s["step"], name, s.get(name), getattr(w, name)))
        result["stats_compared"] = compared
        checks.check(
            "phase 1: each stored figure is the one the stat logger wrote; nulls where it gave none",
            compared > 0 and not mism and nulls_ok,
            {"compared": compared, "mismatches": mism[:5], "nulls_ok": nulls_ok},
        )
        r_graph = [s for s in doc.get("steps") or [] if isinstance((s.get("details") or {}).get("cudagraph"), dict)]
        checks.check(
            "phase 1: V2 model runner reports no per-step CUDA graph, and none is recorded (null, not invented)",
            not r_graph and (args.smoke or fp.get("cuda_graph_mode") not in (None, "", "NONE")),  # the CPU build has no graphs
            {"steps_with_graph": len(r_graph), "configured": fp.get("cuda_graph_mode")},
        )
        if g is not None:
            gdoc = manual_snapshot(side, "G")
            modes: dict[str, int] = {}
            for s in gdoc.get("steps") or []:
                cg = (s.get("details") or {}).get("cudagraph")
                if isinstance(cg, dict):
                    key = str(cg.get("runtime_mode"))
                    modes[key] = modes.get(key, 0) + 1
            result["graph_modes_v1_runner"] = modes
            result["graph_summary_v1_runner"] = (gdoc.get("summary") or {}).get("cudagraph_at_last_step")
            checks.check(
                "phase 1: with the V1 runner and --cudagraph-metrics, the graph each step ran is recorded",
                bool(modes) and any(k in ("FULL", "PIECEWISE", "CUDAGraphMode.FULL", "CUDAGraphMode.PIECEWISE") for k in modes),
                modes,
            )
            stop(g.proc)  # its GPU time would disturb the cost runs

        save(out, "recorder", result, checks)
        # -- 2. the cost ----------------------------------------------------------------------
        cost = measure_cost(args, r, n, {"R": probe_r, "N": probe_n}, lambda partial: save(out, "recorder", {**result, "cost": partial}, checks))
        result["cost"] = cost
        probe = read_probe(probe_r)
        result["recorder_step_time"] = recorder_step_time(probe)
        result["step_time_without_recorder"] = recorder_step_time(read_probe(probe_n))
        result["import"] = import_time(args, pp)
    finally:
        for p in reversed(procs):
            stop(p)
        drop_rings(recorder_dir)
    return result


def measure_cost(args: argparse.Namespace, r: Vllm, n: Vllm, probes: dict[str, Path], progress: Any) -> dict[str, Any]:
    """R against N: closed loops of ``args.seconds`` at each concurrency, the servers taking
    turns (the order alternating), counted over the steady window only. Each run also takes the
    CPU time its API server and engine core spent (``/proc``) and what the probe counted during
    it (step gaps, the recorder's time, garbage collections), so a difference can be attributed
    to the process, and the part of the step, it comes from."""
    levels = args.levels
    procs = {1: 1, 16: 2, 64: 4, 256: 8}
    isl, osl, warm = 512, 256, 1.0
    log("cost: warm-up")
    for s in (r, n):
        run_load(s.base, s.model, [(900_000 + i, isl) for i in range(32)], 64, 16, "warm-", procs=2)  # no prefix shared
    core = {s.name: s.engine_core_pid() for s in (r, n)}
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {c: {"R": [], "N": []} for c in levels}
    inside: dict[int, dict[str, list[dict[str, Any]]]] = {c: {"R": [], "N": []} for c in levels}
    seq = 0
    for rnd in range(args.rounds):
        for li, c in enumerate(levels):
            order = (r, n) if (rnd + li) % 2 == 0 else (n, r)
            for s in order:
                seq += 1
                before = read_probe(probes[s.name])
                cpu0 = (cpu_seconds(s.proc.pid), cpu_seconds(core[s.name]))
                res, t0 = run_for(s.base, s.model, 1_000_000 * seq, isl, osl, c, args.seconds, f"c{c}-", procs=procs.get(c, 8))
                cpu1 = (cpu_seconds(s.proc.pid), cpu_seconds(core[s.name]))
                w = window(res, t0 + warm, t0 + args.seconds)
                tokens = sum(x.tokens for x in res if x.ok)
                for key, c0, c1 in (("api", cpu0[0], cpu1[0]), ("core", cpu0[1], cpu1[1])):
                    w[f"cpu_s_{key}"] = None if c0 is None or c1 is None else round(c1 - c0, 3)
                    w[f"cpu_us_per_token_{key}"] = cpu_us_per_token(c0, c1, tokens)
                runs[c][s.name].append(w)
                time.sleep(0.35)  # the probe writes every 0.25 s
                inside[c][s.name].append(probe_delta(read_probe(probes[s.name]), before))
        log(
            f"cost: round {rnd + 1}/{args.rounds} done: "
            + ", ".join(f"c{c} R/N {runs[c]['R'][-1]['tok_s']}/{runs[c]['N'][-1]['tok_s']}" for c in levels)
        )
        progress({"rounds_done": rnd + 1, "runs": runs})
    out: dict[str, Any] = {"isl": isl, "osl": osl, "rounds": args.rounds, "seconds": args.seconds, "warm_s": warm, "levels": {}}
    for c in levels:
        rr, nn = runs[c]["R"], runs[c]["N"]
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(rr, nn, strict=True) if a["tok_s"] and b["tok_s"]]
        itl = [a["itl_p99_ms"] / b["itl_p99_ms"] for a, b in zip(rr, nn, strict=True) if a["itl_p99_ms"] and b["itl_p99_ms"]]

        def med(rows: list[dict[str, Any]], key: str) -> float | None:
            xs = [x[key] for x in rows if x.get(key) is not None]
            return round(statistics.median(xs), 2) if xs else None

        out["levels"][str(c)] = {
            "tok_s_R": [x["tok_s"] for x in rr],
            "tok_s_N": [x["tok_s"] for x in nn],
            "itl_p99_ms_R": [x["itl_p99_ms"] for x in rr],
            "itl_p99_ms_N": [x["itl_p99_ms"] for x in nn],
            "itl_p50_ms_R": [x["itl_p50_ms"] for x in rr],
            "itl_p50_ms_N": [x["itl_p50_ms"] for x in nn],
            "tokens_per_chunk": sorted({x["tokens_per_chunk"] for x in rr + nn}),
            "errors": [x["errors"] for x in rr + nn if x["errors"]][:3],
            "ratio_tok_s_median": round(statistics.median(ratios), 4) if ratios else None,
            "ratio_tok_s_all": [round(x, 4) for x in ratios],
            "ratio_itl_p99_median": round(statistics.median(itl), 4) if itl else None,
            "ratio_itl_p99_all": [round(x, 4) for x in itl],
            "cpu_us_per_token": {
                f"{proc}_{name}": med(rows, f"cpu_us_per_token_{proc}") for proc in ("api", "core") for name, rows in (("R", rr), ("N", nn))
            },
            "inside": {name: summarise_inside(inside[c][name]) for name in ("R", "N")},
        }
    return out


def summarise_inside(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe's windows of one server at one level, merged: step gaps by running bucket, the
    recorder's per-step time, garbage collections by process and generation."""
    gaps: dict[str, Hist] = {}
    timings: dict[str, dict[str, Hist]] = {}
    gcs: dict[str, dict[str, Hist]] = {}
    steps = 0
    for d in deltas:
        steps += d["schedule_calls"]
        for k, h in d["step_gaps_ns"].items():
            gaps[k] = hist_merge(gaps.get(k, {}), h)
        for series, buckets in d["timings"].items():
            for k, h in buckets.items():
                timings.setdefault(series, {})[k] = hist_merge(timings.get(series, {}).get(k, {}), h)
        for role, gens in d["gc_ns"].items():
            for g, h in gens.items():
                gcs.setdefault(role, {})[g] = hist_merge(gcs.get(role, {}).get(g, {}), h)
    return {
        "steps": steps,
        "step_gap_ms": {k: hist_summary(h, 1e6, 3) for k, h in sorted(gaps.items()) if h.get("n")},
        "recorder_us": {s: {k: hist_summary(h, 1e3) for k, h in sorted(b.items()) if h.get("n")} for s, b in timings.items()},
        "gc_ms": {
            role: {g: {**hist_summary(h, 1e6, 3), "total_ms": round(h.get("sum", 0) / 1e6, 1)} for g, h in sorted(gens.items()) if h.get("n")}
            for role, gens in gcs.items()
        },
    }


def recorder_step_time(probe: dict[str, Any]) -> dict[str, Any]:
    """The whole life's figures of one server's probe (every phase), in the form of a cost
    run's window (``summarise_inside``), with the probe's own writes."""
    return {**summarise_inside([probe_delta(probe, {})]), "probe_writes": probe.get("writes")}


def import_time(args: argparse.Namespace, pp: list[Any]) -> dict[str, Any]:
    import subprocess

    code = (
        "import sys, time, json\nimport vllm, vllm.v1.metrics.loggers, vllm.v1.core.sched.async_scheduler\n"
        "before = set(sys.modules)\nt = time.perf_counter()\nimport collector.vllm.plugin, collector.vllm.scheduler\n"
        "dt = time.perf_counter() - t\nnew = sorted(set(sys.modules) - before)\n"
        "print(json.dumps({'s': dt, 'modules': len(new), 'collector': [m for m in new if m.startswith('collector')],"
        " 'other': [m for m in new if not m.startswith('collector')][:60]}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pp))
    times, last = [], {}
    for _ in range(5):
        proc = subprocess.run([args.python, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        try:
            last = json.loads(proc.stdout.strip().splitlines()[-1])
            times.append(last["s"])
        except (ValueError, IndexError, KeyError):
            return {"error": proc.stderr[-2000:]}
    return {"median_ms": round(1000 * statistics.median(times), 1), "all_ms": [round(1000 * t, 1) for t in times], **last}


# ---- phase 3 ------------------------------------------------------------------------------


def ramp(engine: Vllm, levels: list[int], osl: int, tag: str, phase_s: float) -> threading.Thread:
    """Phases of c concurrent long requests, one after the other; the last keeps running."""

    def go() -> None:
        k = 0
        for c in levels:
            items = [(k + i, 1024 + 16 * (k + i)) for i in range(c)]
            k += c
            if c == levels[-1]:
                run_load(engine.base, engine.model, items, osl, c, tag, procs=1)
                return
            t = threading.Thread(target=run_load, args=(engine.base, engine.model, items, osl, c, tag), daemon=True)
            t.start()
            t.join(timeout=phase_s)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def drill(
    name: str,
    kind: str,
    xid: int,
    side: Sidecar,
    engine: Vllm,
    other: Vllm,
    fire: Path,
    recv: Receiver,
    checks: Checks,
    levels: list[int],
    kmsg: bool,
) -> dict[str, Any]:
    out: dict[str, Any] = {"engine": engine.name, "kind": kind, "expected_xid": xid}
    pid = engine.engine_core_pid()
    out["engine_core_pid"] = pid
    watch = LogWatch(
        engine.log_path, ["unspecified launch failure", "illegal memory access", "EngineCore encountered a fatal error", "EngineDeadError"]
    )
    others_before = {x["id"] for x in side.api(f"/snapshots?engine={other.name}")["items"]}
    ramp(engine, levels, 4096, f"{name}-", 4.0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the last phase has its requests running
        eng = next((e for e in side.engines() if e["name"] == engine.name), {})
        if (eng.get("running") or 0) >= levels[-1] - 1:
            break
        time.sleep(0.3)
    time.sleep(2.0)
    fire.write_text("fire")
    launched_path = Path(str(fire) + ".launched")
    t0 = time.monotonic()
    while not launched_path.exists() and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    launch = json.loads(launched_path.read_text()) if launched_path.exists() else {}
    out["launch"] = launch
    lt = launch.get("ts")
    checks.check(f"{name}: the {kind} kernel was launched inside a step", lt is not None)
    # wait for the snapshot (amended), the alert and vLLM's own lines
    alert_at = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        items = side.api(f"/snapshots?engine={engine.name}")["items"]
        if items and (items[0].get("summary") or {}).get("amended_at") and alert_at is None:
            for ts, a in recv.alerts():
                if f"/snapshots/{items[0]['id']}" in json.dumps(a):
                    alert_at = ts
                    break
        if items and (items[0].get("summary") or {}).get("amended_at") and alert_at is not None and "EngineDeadError" in watch.first:
            break
        time.sleep(0.5)
    time.sleep(3.0)  # every late witness
    watch.close()
    items = side.api(f"/snapshots?engine={engine.name}")["items"]
    others = [x for x in side.api(f"/snapshots?engine={other.name}")["items"] if x["id"] not in others_before]
    out["snapshots"] = [
        {
            k: s.get(k)
            for k in ("id", "trigger_kind", "trigger_source", "created_at", "fault_ts", "step_count", "request_rows", "first_step", "last_step")
        }
        for s in items
    ]
    checks.check(f"{name}: exactly one snapshot of the faulted engine", len(items) == 1, out["snapshots"])
    checks.check(f"{name}: no new snapshot of the other engine", not others, [s["id"] for s in others])
    if not items:
        return out
    doc = get_json(f"{side.base}/api/v1/snapshots/{items[0]['id']}", timeout=60)
    every_xid = [e for e in doc.get("events") or [] if e.get("kind") == "xid"]
    out["xid_events"] = [{k: e.get(k) for k in ("xid", "sources", "pid", "engine", "gpu", "ts", "process")} for e in every_xid]
    # this drill's Xid; an earlier one of the same GPU (another engine's fault) may be in the
    # snapshot too, as the GPU's recent history
    xids = [e for e in every_xid if e.get("xid") == xid and (e.get("ts") or 0) >= (lt or 0) - 1.0]
    sources = sorted(xids[0].get("sources") or []) if xids else []
    checks.check(
        f"{name}: one Xid {xid} event" + (", from NVML and kmsg merged," if kmsg else " from NVML") + " that triggered this engine's snapshot",
        len(xids) == 1
        and xids[0].get("xid") == xid
        and "nvml" in sources
        and (not kmsg or "kmsg" in sources)
        and items[0].get("trigger_kind") == "xid",
        {"events": out["xid_events"], "trigger": items[0].get("trigger_kind")},
    )
    if kmsg:  # the kernel's line names the faulting process: the engine core (TP=1 runs its worker)
        checks.check(f"{name}: the Xid's pid is the engine core's", xids[0].get("pid") == pid if xids else False, pid)
    kinds = sorted({e.get("kind") for e in doc.get("events") or []})
    out["event_kinds"] = kinds
    log_events = [e for e in doc.get("events") or [] if e.get("source") == "log"]
    out["log_events"] = [{k: e.get(k) for k in ("kind", "process", "message")} for e in log_events][:12]
    checks.check(
        f"{name}: vLLM's own error lines parsed (the CUDA error and the engine core's death)",
        any(e.get("kind") == "cuda_error" for e in log_events)
        and any(e.get("kind") == "engine_fatal" and e.get("process") == "EngineCore" for e in log_events)
        and any(e.get("kind") == "engine_dead" for e in log_events),
        kinds,
    )
    steps = doc.get("steps") or []
    rows = request_rows(doc)
    last_step = max((s["step"] for s in steps), default=None)
    at_fire = (launch or {}).get("step")
    last_rows = [r for r in rows if r.get("step") == last_step]
    out["steps"] = {"count": len(steps), "last": last_step, "at_launch": at_fire, "rows": len(rows), "rows_at_last_step": len(last_rows)}
    checks.check(
        f"{name}: the snapshot holds the steps up to the fault, with request rows",
        bool(steps) and at_fire is not None and last_step is not None and last_step >= at_fire and len(last_rows) >= levels[-1] - 1,
        out["steps"],
    )
    checks.check(
        f"{name}: GPU samples and the fingerprint in the snapshot",
        bool(doc.get("gpu_samples")) and bool(doc.get("fingerprint")),
        {"gpu_samples": len(doc.get("gpu_samples") or [])},
    )
    checks.check(f"{name}: the alert reached the receiver with the snapshot's link", alert_at is not None)
    if lt is not None:
        out["timings_ms"] = {
            "launch_to_xid_event": None if not xids else round(1000 * (xids[0]["ts"] - lt), 1),
            "launch_to_snapshot_committed": round(1000 * (items[0]["created_at"] - lt), 1),
            "launch_to_alert_received": None if alert_at is None else round(1000 * (alert_at - lt), 1),
            "launch_to_vllm_error_line": {k: round(1000 * (v - lt), 1) for k, v in watch.first.items()},
        }
        log(f"{name} timings: {out['timings_ms']}")
    if other.proc.poll() is not None:
        return out
    # the other engine is still recorded
    before = next((e for e in side.engines() if e["name"] == other.name), {}).get("steps_received") or 0
    run_load(other.base, other.model, [(i, 256) for i in range(4)], 64, 4, f"{name}-other-")
    time.sleep(2.0)
    after = next((e for e in side.engines() if e["name"] == other.name), {}).get("steps_received") or 0
    checks.check(f"{name}: the other engine on the same GPU is still recorded", after > before, {"before": before, "after": after})
    return out


def phase_fault(args: argparse.Namespace, out: Path, checks: Checks) -> dict[str, Any]:
    work = args.work / "fault"
    work.mkdir(parents=True, exist_ok=True)
    model = write_model(work / "model", tiny=args.smoke)
    site = probe_site(work / "probe-site")
    pp = [REPO, site, *args.site]
    recorder_dir = rings_dir(work, "fault")
    result: dict[str, Any] = {"phase": "fault", "rings": str(recorder_dir)}
    procs: list[Any] = []
    try:
        recv = Receiver()
        fires = {"F1": work / "f1.fire", "F2": work / "f2.fire"}
        kinds = {"F1": "trap", "F2": "store"} if not args.smoke else {"F1": "raise", "F2": "raise"}
        engines = []
        for name in ("F1", "F2"):
            env = {
                "FLIGHTREC_RECORDER_DIR": str(recorder_dir),
                "FLIGHTREC_PROBE_DIR": str(work / f"probe-{name}"),
                "FLIGHTREC_DRILL_FIRE": str(fires[name]),
                "FLIGHTREC_DRILL_KIND": kinds[name],
            }
            kv = 64 * 1024**2 if args.smoke else 16 * 1024**3
            engines.append(start_vllm(name, args.python, model, work, pp, recorder=True, probe=True, env=env, kv_cache_bytes=kv))
        procs += [e.proc for e in engines]
        side = start_sidecar(args.python, work, pp, engines, recorder_dir, alertmanager=recv.url, gpu=not args.smoke)
        procs.append(side.proc)
        result["startup_s"] = {e.name: round(wait_http(f"{e.base}/health", e.proc, args.startup_s, f"vLLM {e.name}"), 1) for e in engines}
        health = get_json(f"{side.base}/healthz")
        result["sources"] = health.get("sources")
        kmsg = any("kmsg" in str(x.get("name")) and x.get("supported") for x in health.get("sources") or [])
        f1, f2 = engines
        result["drill1"] = drill("drill1", "trap", 43, side, f1, f2, fires["F1"], recv, checks, [1, 2, 4, 8, 16], kmsg)
        stop(f1.proc)
        result["drill2"] = drill("drill2", "store", 31, side, f2, f1, fires["F2"], recv, checks, [4, 16], kmsg)
        incidents = side.api("/incidents")
        result["incidents"] = incidents if isinstance(incidents, list) else incidents.get("items")
    finally:
        for p in reversed(procs):
            stop(p)
        drop_rings(recorder_dir)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", choices=["recorder", "fault"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/flightrec-gpu-tier"), help="logs, rings, databases (kept)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that has vLLM (default: this one)")
    ap.add_argument("--site", type=Path, action="append", default=[], help="folders to add to PYTHONPATH after this checkout")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the cost comparison")
    ap.add_argument("--seconds", type=float, default=6.0, help="each closed loop's length (the first second is not counted)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--startup-s", type=float, default=420.0)
    ap.add_argument("--no-graph-check", action="store_true", help="skip the V1-runner server that reports CUDA graphs")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, small KV caches: the script's own smoke run on vLLM's CPU build")
    args = ap.parse_args()
    for site in args.site:
        sys.path.append(str(site))
    if args.smoke:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    args.out.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    result: dict[str, Any] = {"machine": machine_facts(args.python)}
    PARTIAL.update(result)
    log(f"machine: {result['machine']}")
    t0 = time.monotonic()
    try:
        if args.phase == "recorder":
            result.update(phase_recorder(args, args.out, checks))
        else:
            result.update(phase_fault(args, args.out, checks))
    except Exception:  # noqa: BLE001 - the figures so far are written all the same
        result["error"] = traceback.format_exc()
        log(result["error"])
        checks.check("phase ran to its end", False)
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["checks"] = checks.items
    result["failed"] = checks.failed
    (args.out / f"gpu-tier-{args.phase}.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"{len(checks.items) - len(checks.failed)} of {len(checks.items)} checks passed; failed: {checks.failed}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
