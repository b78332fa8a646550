"""BENCHMARKS.md as one current table, generated from the benches' ``--json`` output.

    python bench/table.py run node                  # run a bench, keep its figures in bench/results/node.json
    python bench/table.py run node -- --duration 60  # extra arguments for the bench
    python bench/table.py adopt gpu-cost FILE --machine "..." --date "..." --command "..."  # a run made elsewhere
    python bench/table.py render                    # write BENCHMARKS.md from bench/results/
    python bench/table.py render --check            # exit 1 when BENCHMARKS.md is not what render writes (CI)

Each result file holds one run of one bench: the bench's own ``--json`` output under
``figures``, with the command, the commit it ran at, the date, the machine and its load before and
after. ``SECTIONS`` below says which figures of which bench make the table, each with the goal it
answers to and a few lines on how to read it. A figure that was not measured shows as "not
measured", never as 0. Dated runs of the past, and the reasons behind the figures, are in
docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
OUT = ROOT / "BENCHMARKS.md"


@dataclass(frozen=True)
class Metric:
    """One figure of a bench's JSON: ``path`` is dotted keys (``fault_to_snapshot_ms.p99``)."""

    name: str
    path: str
    unit: str
    goal: str = ""  # as the issue states it; "" for a figure shown for reference
    meets: Callable[[float], bool] | None = None
    scale: float = 1.0
    digits: int = 1


@dataclass(frozen=True)
class Section:
    key: str  # bench/results/<key>.json
    title: str
    bench: str  # the script, relative to the repository
    args: tuple[str, ...]
    read: str  # how to read it
    metrics: tuple[Metric, ...]
    python: str = ""  # another interpreter (the vLLM environment's), named by an environment variable


def le(x: float) -> Callable[[float], bool]:
    return lambda v: v <= x


def ge(x: float) -> Callable[[float], bool]:
    return lambda v: v >= x


MB_PER_MIB = 2**20 / 1e6

SECTIONS: tuple[Section, ...] = (
    Section(
        "node",
        "Node scale, quiet",
        "bench/bench_node.py",
        ("--engines", "8", "--running", "256", "--steps-per-second", "100", "--duration", "120", "--faults", "4"),
        "A real `flightrec serve` watching 8 simulated engines (256 running requests each, 100 steps/s, "
        "their rings and their /metrics, a whole vLLM 0.32 page each, scraped), SQLite. CPU is the sidecar's own utime + stime as a "
        "share of one core in the steady half of the window; RSS is its peak (VmHWM). Every step comes "
        "as two records (stats and requests): received must equal written. Faults are Xid lines naming "
        "one engine each, timed from the write to the snapshot row.",
        (
            Metric("sidecar CPU, steady", "sidecar_cpu_share_steady", "% of a core", "<= 3", le(3.0), 100.0, 2),
            Metric("sidecar peak RSS", "sidecar_rss_peak_mib", "MB", "<= 200", le(200.0), MB_PER_MIB, 0),
            Metric("step records received", "step_records_received", "records", "= written", None, 1.0, 0),
            Metric("step records written by the engines", "step_records_written", "records", "", None, 1.0, 0),
            Metric("duplicate stored steps", "db_duplicate_steps", "steps", "0", le(0), 1.0, 0),
            Metric("fault -> durable snapshot, p99", "fault_to_snapshot_ms.p99", "ms", "<= 500", le(500.0), 1.0, 0),
            Metric("faults without a snapshot", "faults_without_snapshot", "faults", "0", le(0), 1.0, 0),
        ),
    ),
    Section(
        "node-logs",
        "Node scale, quiet, each engine's log followed",
        "bench/bench_node.py",
        ("--engines", "8", "--running", "256", "--steps-per-second", "100", "--duration", "120", "--faults", "4", "--engine-logs"),
        "The quiet node as the DaemonSet runs it: the sidecar also follows each engine's log (a file per "
        "engine, vLLM's stat line in it every 10 s, read every 0.1 s).",
        (
            Metric("sidecar CPU, steady", "sidecar_cpu_share_steady", "% of a core", "<= 3", le(3.0), 100.0, 2),
            Metric("sidecar peak RSS", "sidecar_rss_peak_mib", "MB", "<= 200", le(200.0), MB_PER_MIB, 0),
            Metric("step records received", "step_records_received", "records", "= written", None, 1.0, 0),
            Metric("step records written by the engines", "step_records_written", "records", "", None, 1.0, 0),
            Metric("fault -> durable snapshot, p99", "fault_to_snapshot_ms.p99", "ms", "<= 500", le(500.0), 1.0, 0),
        ),
    ),
    Section(
        "node-busy",
        "Node scale, 8 busy loops beside it",
        "bench/bench_node.py",
        ("--engines", "8", "--running", "256", "--steps-per-second", "100", "--duration", "120", "--busy", "8", "--faults", "8"),
        "The same node with 8 busy loops (4 per core on 2 cores) competing for the CPU: the fault path must hold when the node is saturated.",
        (
            Metric("fault -> durable snapshot, p99", "fault_to_snapshot_ms.p99", "ms", "<= 1000", le(1000.0), 1.0, 0),
            Metric("faults without a snapshot", "faults_without_snapshot", "faults", "0", le(0), 1.0, 0),
            Metric("sidecar CPU, steady", "sidecar_cpu_share_steady", "% of a core", "", None, 100.0, 2),
        ),
    ),
    Section(
        "soak",
        "Soak",
        "bench/soak.py",
        ("--hours", "2", "--interval", "600"),
        "Hours of the quiet node's load with an Xid every interval: RSS must not climb (the end within 5% "
        "of the value after the first interval), every record stored once, every fault snapshotted, no "
        "task restarted. `--hours 0.17 --interval 120` is the short form; the table says which ran. The store's "
        "growth is the recording's (it grows with the hours); the snapshots grow with the faults, one every "
        "interval here, and are stated per fault.",
        (
            Metric("hours run", "summary.hours", "h", "2", ge(2.0), 1.0, 2),
            Metric("peak RSS", "summary.rss_peak_mib", "MB", "<= 200", le(200.0), MB_PER_MIB, 0),
            Metric("RSS at the end vs after the first interval", "summary.rss_drift", "%", "<= 5", le(5.0), 100.0, 1),
            Metric("sidecar CPU, mean", "summary.cpu_share_mean", "% of a core", "<= 3", le(3.0), 100.0, 2),
            Metric("faults without a snapshot", "summary.faults_missing", "faults", "0", le(0), 1.0, 0),
            Metric("task restarts", "summary.restarts_total", "restarts", "0", le(0), 1.0, 0),
            Metric("step records written and not received", "summary.records_short", "records", "0", le(0), 1.0, 0),
            Metric("gaps (records read-skipped while far behind)", "summary.gaps", "gaps", "0", le(0), 1.0, 0),
            Metric(
                "store growth, 8 engines (steps, seconds, scrapes, samples, events)", "summary.store_gb_per_day_8", "GB/day", "<= 2", le(2.0), 1.0, 2
            ),
            Metric("a snapshot, stored", "summary.snapshot_mib_per_fault", "MB", "", None, MB_PER_MIB, 1),
        ),
    ),
    Section(
        "detectors",
        "The detectors' tick at node scale",
        "bench/bench_detectors.py",
        ("--engines", "8", "--ticks", "60"),
        "Every detector over 8 engines' per-second step folds and scrapes with their two minutes of "
        "history full, once a second on the event loop, in process: CPU per tick, median. A share of the "
        "node's sidecar CPU above that the 60-second node bench does not reach in full (its history "
        "fills over the run).",
        (Metric("a tick, 8 engines, median", "tick_ms.median", "ms", "", None, 1.0, 2),),
    ),
    Section(
        "store-size",
        "The node-local store's size",
        "bench/bench_store_size.py",
        ("--engines", "8", "--minutes", "10"),
        "Steps, scrapes and GPU samples at node scale written through the real writer into SQLite; the "
        "size per engine-hour and the day of 8 busy engines at the default retention.",
        (
            Metric("store per engine-hour", "bytes_per_engine_hour", "MB", "", None, 1e-6, 1),
            Metric("a day of 8 busy engines", "projected_day_8_engines_bytes", "GB", "<= 2", le(2.0), 1e-9, 2),
        ),
    ),
    Section(
        "workload",
        "The workload export",
        "bench/bench_workload.py",
        ("--requests", "10000"),
        "`WorkloadLog.export` over a full workload log of 10,000 requests, in process, median of runs: "
        "what a snapshot of one engine spends building its replayable load on the event loop, with the "
        "cycle collector set as `flightrec serve` sets it (`collector.heap`). The export makes a list per "
        "point of its concurrency series (~16,000 here), so with CPython's default collector settings it "
        "costs more: that figure is for reference.",
        (
            Metric("export at 10,000 requests, median", "export_ms.median", "ms", "<= 5", le(5.0), 1.0, 1),
            Metric("crashed export at 10,000 requests, median", "export_crashed_ms.median", "ms", "<= 5", le(5.0), 1.0, 1),
            Metric("export, CPython's default collector settings, median", "export_default_gc_ms.median", "ms", "", None, 1.0, 1),
        ),
    ),
    Section(
        "node-wide-fault",
        "One node-wide fault",
        "bench/bench_node_wide_fault.py",
        ("--runs", "3"),
        "One fault that opens a snapshot of each of 8 engines (1,024 steps x 64 requests each): the "
        "trigger to the last snapshot durable, medians of runs; the goal is no slower than the 390 ms "
        "measured when the 8 were first committed together.",
        (
            Metric("trigger -> captures done, on the loop", "on_loop_ms", "ms", "", None, 1.0, 0),
            Metric("trigger -> last snapshot durable", "last_durable_ms", "ms", "<= 390", le(390.0), 1.0, 0),
        ),
    ),
    Section(
        "recorder",
        "The recorder inside vLLM, per step",
        "bench/bench_recorder.py",
        (),
        "Per engine step at 256 running requests on the vLLM CPU build, beside vLLM's own "
        "PrometheusStatLogger: the stat logger's record, the scheduler's per-request rows, and the same "
        "with the HiSparse connector's host blocks and mirror rows, while the running set holds (a record "
        "then carries only the step's own columns); the last row is the cost when the set changes at "
        "every step (every record full). Run with the vLLM environment's python (`FLIGHTREC_VLLM_PYTHON`).",
        (
            Metric("vLLM's PrometheusStatLogger (reference)", "by_running.256.prometheus.median_us", "us", "", None, 1.0, 1),
            Metric("stat logger", "by_running.256.stat_logger.median_us", "us", "", None, 1.0, 1),
            Metric("per-request rows", "by_running.256.per_request.median_us", "us", "<= 20", le(20.0), 1.0, 1),
            Metric("per-request rows with HiSparse", "by_running.256.hisparse.median_us", "us", "<= 40", le(40.0), 1.0, 1),
            Metric("the same, host lists growing as in decode", "by_running.256.hisparse_grow.median_us", "us", "", None, 1.0, 1),
            Metric("per-request rows, the running set changing every step", "by_running.256.per_request_churn.median_us", "us", "", None, 1.0, 1),
        ),
        python="FLIGHTREC_VLLM_PYTHON",
    ),
    Section(
        "recorder-import",
        "The recorder's import inside vLLM",
        "bench/bench_recorder_import.py",
        (),
        "What loading the recorder adds to vLLM's start: the import of the plugin and the scheduler subclass in a fresh interpreter, median of runs.",
        (Metric("import", "import_ms.median", "ms", "<= 40", le(40.0), 1.0, 1),),
        python="FLIGHTREC_VLLM_PYTHON",
    ),
    Section(
        "alert-latency",
        "Fault to page",
        "bench/bench_alert_latency.py",
        ("--mode", "sidecar", "--faults", "60"),
        "A real sidecar follows a kernel log and an engine log; an Xid line or a CUDA error line is "
        "appended and a real Alertmanager's API polled until the alert is there. The CUDA line waits "
        "for the traceback's flush (0.2 s).",
        (
            Metric("Xid line -> Alertmanager, p99", "Xid line -> Alertmanager API.p99_ms", "ms", "<= 1000", le(1000.0), 1.0, 0),
            Metric("CUDA error line -> Alertmanager, p99", "CUDA error line -> Alertmanager API.p99_ms", "ms", "<= 1000", le(1000.0), 1.0, 0),
        ),
    ),
    Section(
        "fault-to-snapshot",
        "Fault to durable snapshot, a full ring",
        "bench/bench_fault_to_snapshot.py",
        ("--faults", "50"),
        "The real service with a full ring (4,096 steps x 64 requests), SQLite; each fault an Xid line, timed to the snapshot's commit.",
        (Metric("Xid line -> snapshot committed, p99", "written_to_committed.p99_ms", "ms", "<= 500", le(500.0), 1.0, 0),),
    ),
    Section(
        "wedge",
        "A wedged engine (simulated)",
        "bench/bench_wedge.py",
        ("--rounds", "3"),
        "A simulated decode step that never ends (requests held, /health 200): the last step to the "
        "wedge event, the snapshot and the page (the threshold's floor is 10 s), and the release to ok.",
        (
            Metric("last step -> event, median", "summary.last_step_to_event_s.median", "s", "<= 11", le(11.0), 1.0, 2),
            Metric("last step -> page, median", "summary.last_step_to_page_s.median", "s", "<= 12", le(12.0), 1.0, 2),
            Metric("release -> ok, median", "summary.resume_to_state_ok_s.median", "s", "<= 2", le(2.0), 1.0, 2),
        ),
    ),
    Section(
        "storm",
        "A fault storm into one Postgres",
        "bench/bench_storm_commit.py",
        ("--nodes", "64"),
        "64 nodes' snapshots (one fault each within 10 s) committed into one real Postgres with fsync: "
        "fault to stored, and every snapshot stored once in one incident.",
        (
            Metric("fault -> stored, p99", "fault_to_store_s.p99", "s", "<= 1", le(1.0), 1.0, 2),
            Metric("duplicates", "stored.duplicates", "snapshots", "0", le(0), 1.0, 0),
        ),
    ),
    Section(
        "gpu-cost",
        "The recorder's cost on a GPU (open loop, 8B)",
        "scripts/gpu/run-h200.sh",
        ("cost",),
        "A real vLLM 0.26 on one GPU with the recorder (R) and without (N), Poisson arrivals at 50/80/95% "
        "of capacity, rounds until the 95% interval is narrower than 1.5%: delivered tokens/s R over N. "
        "Run on the lent GPU machine (docs/gpu-runs/).",
        (
            Metric("tokens/s R/N at 50%", "ratios.0.5.tok_s.ratio", "", ">= 0.98", ge(0.98), 1.0, 3),
            Metric("tokens/s R/N at 80%", "ratios.0.8.tok_s.ratio", "", ">= 0.98", ge(0.98), 1.0, 3),
            Metric("tokens/s R/N at 95%", "ratios.0.95.tok_s.ratio", "", ">= 0.98", ge(0.98), 1.0, 3),
        ),
    ),
    Section(
        "gpu-hang",
        "A real GPU hang",
        "scripts/gpu/run-h200.sh",
        ("hang",),
        "A kernel spinning on the model's stream inside a step, 16 requests streaming: the launch to the "
        "wedge event, the snapshot and the page (the floor is 10 s).",
        (
            Metric("launch -> event", "timings_ms.launch_to_event", "ms", "", None, 1.0, 0),
            Metric("launch -> snapshot committed", "timings_ms.launch_to_snapshot_committed", "ms", "", None, 1.0, 0),
        ),
    ),
)


def dig(doc: Any, path: str) -> Any:
    """``a.b.c`` into nested dicts; keys may hold dots (``0.5``): the longest key that matches wins."""
    if path == "":
        return doc
    if not isinstance(doc, dict):
        return None
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in doc:
            got = dig(doc[key], ".".join(parts[n:]))
            if got is not None:
                return got
    return None


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = round(int(Path("/proc/meminfo").read_text().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem, "python": platform.python_version()}


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def section(key: str) -> Section:
    for s in SECTIONS:
        if s.key == key:
            return s
    raise SystemExit(f"no section {key!r}; known: {', '.join(s.key for s in SECTIONS)}")


def run(key: str, extra: list[str]) -> Path:
    s = section(key)
    python = os.environ.get(s.python, "") if s.python else sys.executable
    if not python:
        raise SystemExit(f"{s.bench} needs the vLLM environment's python in ${s.python}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        argv = [python, s.bench, *s.args, *extra, "--json", str(out)]
        shown = " ".join(["python", s.bench, *s.args, *extra])
        load_before = os.getloadavg()
        t0 = time.time()
        env = dict(os.environ)
        # this checkout first: another environment (vLLM's) must import it, and some benches use tests.support
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.run(argv, cwd=ROOT, env=env)
        if not out.exists():
            raise SystemExit(f"{shown} failed (exit {proc.returncode}) and wrote no figures; nothing kept")
        figures = json.loads(out.read_text())
        if proc.returncode != 0:  # a bench whose own checks failed (the soak) still measured: kept, and said
            print(f"{shown} exited {proc.returncode}: its figures are kept with that exit status")
            figures = {**figures, "exit_status": proc.returncode} if isinstance(figures, dict) else figures
    return keep(
        key,
        figures,
        command=shown,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
        mach={**machine(), "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in os.getloadavg()]},
        at=commit(),
    )


def keep(key: str, figures: Any, *, command: str, date: str, mach: dict[str, Any], at: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{key}.json"
    doc = {"key": key, "command": command, "commit": at, "date": date, "machine": mach, "figures": figures}
    path.write_text(scrub(json.dumps(doc, indent=1, sort_keys=False)) + "\n")
    print(f"kept {path.relative_to(ROOT)}")
    return path


def goal(m: Metric) -> str:
    return (
        f"{m.goal} {m.unit}".strip()
        if m.goal and m.goal[0] in "<>=" and m.unit not in ("", "%")
        else m.goal + ("%" if m.unit == "%" and m.goal else "")
    )


def scrub(text: str) -> str:
    """A kept run names no folder of the machine it ran on: the checkout is ".", and the
    runner's own ``--json`` file (a temporary one) is left out of a command a bench recorded."""
    text = text.replace(str(ROOT), ".")
    return re.sub(r" --json [^\s\"]+", "", text)


def fmt(value: Any, m: Metric) -> str:
    if value is None or isinstance(value, (dict, list)) or isinstance(value, bool):
        return "not measured"
    v = float(value) * m.scale
    text = f"{v:,.{m.digits}f}"
    return f"{text} {m.unit}".strip()


def met(value: Any, m: Metric) -> str:
    if m.meets is None or value is None or isinstance(value, (dict, list, bool)):
        return ""
    return "yes" if m.meets(float(value) * m.scale) else "**no**"


def where(doc: dict[str, Any]) -> str:
    mach = doc.get("machine") or {}
    if isinstance(mach, str):
        return mach
    parts = [f"{mach.get('cores')} cores" if mach.get("cores") else "", str(mach.get("cpu") or "")]
    if mach.get("gpu"):
        parts.append(str(mach["gpu"]))
    if mach.get("load_before") is not None:
        lb, la = mach["load_before"], mach.get("load_after") or ["?"]
        parts.append(f"load {lb[0]} -> {la[0]}")
    return ", ".join(p for p in parts if p)


def render() -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python bench/table.py render` from the runs kept in `bench/results/` (each the",
        "bench's own `--json` output with its command, commit, date and machine); do not edit by hand.",
        "`python bench/table.py run KEY` runs one bench again and keeps its figures. A figure nobody",
        "measured says so. Dated runs of the past and the reasons behind today's figures:",
        "[docs/benchmarks-history.md](docs/benchmarks-history.md).",
        "",
        "| metric | goal | now | met | run |",
        "| --- | --- | ---: | --- | --- |",
    ]
    docs: dict[str, dict[str, Any] | None] = {}
    for s in SECTIONS:
        path = RESULTS / f"{s.key}.json"
        doc = json.loads(path.read_text()) if path.exists() else None
        if doc is not None and isinstance(doc.get("figures"), dict) and "$file" in doc["figures"]:
            doc["figures"] = json.loads((ROOT / doc["figures"]["$file"]).read_text())
        docs[s.key] = doc
    for s in SECTIONS:
        doc = docs[s.key]
        lines.append(f"| **{s.title}** | | | | |")
        for m in s.metrics:
            value = dig(doc["figures"], m.path) if doc else None
            lines.append(f"| {m.name} | {goal(m)} | {fmt(value, m)} | {met(value, m)} | [{s.key}](#{s.key}) |")
    lines += ["", "## The runs and how to read them", ""]
    for s in SECTIONS:
        doc = docs[s.key]
        lines += [f"### {s.key}", "", s.read, ""]
        if doc is None:
            lines += [f"Not run yet: `python bench/table.py run {s.key}` (`python {s.bench} {' '.join(s.args)}`).", ""]
            continue
        lines += [f"    {doc['command']}", "", f"At {doc['commit']}, {doc['date']}; {where(doc)}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one bench and keep its figures")
    r.add_argument("key")
    r.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more arguments for the bench")
    a = sub.add_parser("adopt", help="keep the figures of a run made elsewhere (a GPU machine)")
    a.add_argument("key")
    a.add_argument("file")
    a.add_argument("--command", required=True)
    a.add_argument("--date", required=True)
    a.add_argument("--machine", required=True)
    a.add_argument("--commit", default=None)
    w = sub.add_parser("render", help="write BENCHMARKS.md")
    w.add_argument("--check", action="store_true", help="exit 1 when BENCHMARKS.md differs")
    args = p.parse_args()
    if args.cmd == "run":
        extra = [x for x in args.extra if x != "--"]
        run(args.key, extra)
    elif args.cmd == "adopt":
        section(args.key)
        src = Path(args.file).resolve()
        figures: Any = json.loads(src.read_text())  # it must be a bench's JSON
        if src.is_relative_to(ROOT):  # a record already in the repository is referred to, not copied
            figures = {"$file": str(src.relative_to(ROOT))}
        keep(
            args.key,
            figures,
            command=args.command,
            date=args.date,
            mach={"cpu": args.machine},
            at=args.commit or commit(),
        )
    else:
        text = render()
        if args.check:
            if not OUT.exists() or OUT.read_text() != text:
                print("BENCHMARKS.md is not what bench/table.py renders: run `python bench/table.py render`", file=sys.stderr)
                return 1
            return 0
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
