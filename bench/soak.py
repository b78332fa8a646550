"""The soak: hours of node-scale load with scrapes and a fault every interval, and what the sidecar
does over them (memory that only grows, CPU that creeps, a task that restarts, a record or a
fault that goes missing).

    python bench/soak.py                                   # 2 hours, 8 x 256 x 100/s, a fault every 10 min
    python bench/soak.py --hours 0.17 --interval 120       # a 10-minute run, a fault every 2 min (CI)
    python bench/soak.py --db postgres --json soak.json

What runs is ``bench/bench_node.py``'s: ``flightrec simulate`` (N engines, their rings and their
``/metrics``) and a real ``flightrec serve`` on its config (NVML off, the kernel log a file, SQLite
or a scratch Postgres database). Per interval (``--interval`` seconds): the sidecar's CPU as a
share of one core (``/proc/PID/stat``), its RSS at the interval's end and its peak (``VmHWM``),
the records it says it received, its recorder lag, the node-local store's size (SQLite: the
database file with its WAL), task restarts (``flightrec_task_restarts_total``, every task); in
the middle of each interval one Xid line naming the next engine's API-server pid, timed until its
snapshot row is in the database.

At the end, the checks the issue sets (each printed PASS/FAIL, and in ``--json``): every step
record received (as many as the simulator says it wrote: a stats and a requests half a step, the
stats half alone for its shutdown's step) and stored once (steps in ``engine_step_chunks``, no
duplicate) or counted as thinned while the sidecar was behind; every fault snapshotted once; no task restarted; peak RSS <= ``--rss-goal-mib``;
the RSS at the end within ``--rss-drift`` of the RSS after the first interval; the store's
growth per engine-hour. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_node as node  # noqa: E402
import bench_store_size as store_size  # noqa: E402


def restarts(base: str) -> float | None:
    """Every task's and source's restarts, summed, from the sidecar's /metrics."""
    return metric_total(base, "restarts")


def metric_total(base: str, word: str) -> float | None:
    """The sum of the sidecar's samples whose name holds ``word``."""
    try:
        text = httpx.get(base + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if word in s.name and not s.name.endswith("_created"):
                total += float(s.value)
    return total


def memory(base: str) -> dict[str, float | None]:
    """Where the sidecar's memory is (MiB): its C heap by state and SQLite's share, and the
    blocks Python's allocator holds for live objects (a count), from its /metrics (null where
    it does not say); the rest of its resident size is Python's object arenas, code and stacks."""
    out: dict[str, float | None] = {
        "malloc_in_use_mib": None,
        "malloc_free_mib": None,
        "malloc_mapped_mib": None,
        "sqlite_mib": None,
        "python_blocks": None,
    }
    try:
        text = httpx.get(base + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return out
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "flightrec_malloc_bytes":
                out[f"malloc_{s.labels.get('state')}_mib"] = round(s.value / 2**20, 1)
            elif s.name == "flightrec_sqlite_memory_bytes":
                out["sqlite_mib"] = round(s.value / 2**20, 1)
            elif s.name == "flightrec_python_allocated_blocks":
                out["python_blocks"] = s.value
    return out


def store_bytes(db: node.Database, work: Path) -> int | None:
    if db.kind == "sqlite":
        return sum(p.stat().st_size for p in work.glob("*.db*") if p.is_file())
    rows = db.query("SELECT pg_database_size(current_database())")
    return int(rows[0][0]) if rows else None


# What a snapshot is stored as: these grow with the faults, not with the hours.
SNAPSHOT_TABLES = ("incidents", "snapshots", "snapshot_parts")


def table_bytes(db: node.Database) -> dict[str, int] | None:
    """Bytes per table, its indexes with it (``bench_store_size.sizes``: SQLite's dbstat pages,
    Postgres' relation sizes); None where they cannot be read."""
    try:
        return {table: sum(parts.values()) for table, parts in store_size.sizes(db.url).items()}
    except Exception:  # noqa: BLE001 - a build of SQLite without dbstat: not measured
        return None


def soak(args: argparse.Namespace) -> dict[str, Any]:
    tree = Path(args.tree).resolve()
    total_s = args.hours * 3600
    intervals = max(1, int(total_s // args.interval))
    work = Path(tempfile.mkdtemp(prefix="flightrec-soak-"))
    recorder = Path(tempfile.mkdtemp(prefix="flightrec-soak-rings-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    sim_config, summary, kmsg = work / "sim.yaml", work / "summary.json", work / "kmsg.log"
    kmsg.write_text("")
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    start_delay = 8
    sim_cmd = [
        node.PY,
        "-m",
        "collector.cli",
        "simulate",
        "--engines",
        str(args.engines),
        "--running",
        str(args.running),
        "--steps-per-second",
        str(args.steps_per_second),
        "--duration",
        str(intervals * args.interval + 5),
        "--recorder-dir",
        str(recorder),
        "--write-config",
        str(sim_config),
        "--serve-metrics",
        "--start-delay",
        str(start_delay),
        "--linger",
        "--summary-json",
        str(summary),
        "--progress-every",
        "300",
    ]
    db = node.Database(args.db, work, node.PG_ADMIN)
    sim_log, side_log = open(work / "simulate.log", "w"), open(work / "sidecar.log", "w")
    sim = subprocess.Popen(sim_cmd, cwd=tree, env=env, stdout=sim_log, stderr=subprocess.STDOUT)
    side: subprocess.Popen[bytes] | None = None
    poller = node.SnapshotPoller(db)
    fig: dict[str, Any] = {
        "bench": "soak",
        "engines": args.engines,
        "running": args.running,
        "steps_per_second": args.steps_per_second,
        "interval_s": args.interval,
        "intervals": intervals,
        "db": args.db,
        "tree": str(tree),
        "commit": node.tree_commit(tree),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_start": node.loadavg(),
        "per_interval": [],
    }
    try:
        t_sim = time.time()
        while not sim_config.exists():
            if sim.poll() is not None or time.time() - t_sim > 60:
                raise RuntimeError(f"the load did not start; see {work / 'simulate.log'}")
            time.sleep(0.05)
        doc = yaml.safe_load(sim_config.read_text())
        port = node.free_port()
        doc.update(database=db.url, port=port, host="127.0.0.1", kmsg=str(kmsg), nvml="off", host_name="soak-node")
        side_config = work / "sidecar.yaml"
        side_config.write_text(yaml.safe_dump(doc))
        side = subprocess.Popen(
            [node.PY, "-m", "collector.cli", "serve", "--config", str(side_config)], cwd=tree, env=env, stdout=side_log, stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{port}"
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            if side.poll() is not None or time.time() - t_sim > 300:
                raise RuntimeError(f"the sidecar did not start; see {work / 'sidecar.log'}")
            time.sleep(0.1)
        poller.start()
        time.sleep(max(0.0, t_sim + start_delay + 1 - time.time()))  # the load's first step
        faults: list[tuple[float, str]] = []
        seq = 9000
        t_i, cpu_i = time.time(), node.proc_cpu_s(side.pid)
        for i in range(intervals):
            fault_at = t_i + args.interval / 2
            time.sleep(max(0.0, fault_at - time.time()))
            engine_i = i % args.engines
            seq += 1
            bus = f"0000:{(i % 200) + 16:02x}:00"
            pid = node.FIRST_PID + 100 * engine_i
            line = f"4,{seq},{int(time.monotonic() * 1e6)},c;NVRM: Xid (PCI:{bus}): 43, pid={pid}, name=python3, channel 0x0000000a"
            faults.append((time.time(), node.engine_name(doc, engine_i)))
            with open(kmsg, "a") as f:
                f.write(line + "\n")
            time.sleep(max(0.0, t_i + args.interval - time.time()))
            t_j, cpu_j = time.time(), node.proc_cpu_s(side.pid)
            scraped = node.scrape_sidecar(base)
            row = {
                "minute": round((t_j - t_sim - start_delay) / 60, 1),
                "cpu_share": round((cpu_j - cpu_i) / (t_j - t_i), 4),
                "rss_mib": round((node.proc_status_kib(side.pid, "VmRSS") or 0) / 1024, 1),
                "rss_peak_mib": round((node.proc_status_kib(side.pid, "VmHWM") or 0) / 1024, 1),
                "steps_received": scraped.get("steps_received"),
                "lag_s": scraped.get("lag_s"),
                "gaps": scraped.get("gaps"),
                "lost_bytes": scraped.get("lost_bytes"),
                "store_mib": None if (b := store_bytes(db, work)) is None else round(b / 2**20, 1),
                "restarts": restarts(base),
                **memory(base),
                "load": node.loadavg(),
            }
            fig["per_interval"].append(row)
            print(json.dumps(row), flush=True)
            t_i, cpu_i = t_j, cpu_j
        # the load ends; the sidecar catches up, then the figures are read
        t_end = time.time()
        while not summary.exists() and time.time() - t_end < 60:
            time.sleep(0.5)
        load = json.loads(summary.read_text()) if summary.exists() else None
        written = load["steps"] if load else None
        records = node.step_records(load)
        fig["step_records_written"] = records
        last: dict[str, Any] = {}
        while time.time() - t_end < 120:
            last = node.scrape_sidecar(base)
            if records is not None and (last.get("steps_received") or 0) >= records:
                break
            time.sleep(1.0)
        # the writer's last batches: the stored rows stop changing (a step is written a hold
        # after its first half came, in batches a second or more apart)
        rows_seen, still_since = -1, time.time()
        while time.time() - t_end < 180:
            counted = node.step_rows(db)
            now_rows = int(counted[0][0]) if counted else -1
            if now_rows != rows_seen:
                rows_seen, still_since = now_rows, time.time()
            elif time.time() - still_since >= 10.0:
                break
            time.sleep(1.0)
        fig["sidecar_at_end"] = node.scrape_sidecar(base).get("families")
        fig["steps_thinned"] = metric_total(base, "steps_thinned")  # not stored while the sidecar was behind
        fig["load_end"] = node.loadavg()
        fig["written_steps"] = written
        end = node.scrape_sidecar(base)
        fig["step_records_received"] = end.get("steps_received")
        # why a record was not received, where the sidecar knows: a gap (read-skipped while far
        # behind), bytes overwritten before they were read, a record set aside
        for key in ("gaps", "gap_bytes", "lost_bytes", "bad_records"):
            fig[key] = end.get(key)
        fig["db_step_rows"], fig["db_distinct_steps"] = node.step_counts(db) or (None, None)
        fig["store_mib"] = None if (b := store_bytes(db, work)) is None else round(b / 2**20, 1)
        tables = table_bytes(db)
        fig["store_tables_mib"] = None if tables is None else {k: round(v / 2**20, 2) for k, v in sorted(tables.items())}
        fig["restarts"] = restarts(base)
        fig["rss_peak_mib"] = round((node.proc_status_kib(side.pid, "VmHWM") or 0) / 1024, 1)
        poller.stop.set()
        poller.join(5)
        used: set[int] = set()
        lat: list[float] = []
        for t0, engine in faults:
            hit = next((s for s in poller.seen if s[2] == engine and s[0] >= t0 and s[1] not in used), None)
            if hit is not None:
                used.add(hit[1])
                lat.append(hit[0] - t0)
        fig["faults"] = len(faults)
        fig["faults_snapshotted"] = len(lat)
        fig["xid_snapshots"] = sum(1 for s in poller.seen if s[3] == "xid")
        fig["fault_to_snapshot_ms"] = {"p50": node.pct(lat, 50), "max": max(lat) if lat else None}
        fig["fault_to_snapshot_ms"] = {k: None if v is None else round(1000 * v, 1) for k, v in fig["fault_to_snapshot_ms"].items()}
    finally:
        poller.stop.set()
        for p in (sim, side):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in (sim, side):
            if p is not None:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        sim_log.close()
        side_log.close()
        if not args.keep:
            db.drop()
            shutil.rmtree(recorder, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
        else:
            fig["workdir"] = str(work)
    fig["checks"] = checks(fig, args)
    return fig


def checks(fig: dict[str, Any], args: argparse.Namespace) -> dict[str, bool]:
    rows = fig["per_interval"]
    written = fig.get("written_steps")
    first_rss = rows[0]["rss_mib"] if rows else None
    end_rss = rows[-1]["rss_mib"] if rows else None
    hours = len(rows) * args.interval / 3600
    grew = (rows[-1]["store_mib"] - rows[0]["store_mib"]) if rows and rows[0]["store_mib"] is not None and rows[-1]["store_mib"] is not None else None
    if grew is not None and len(rows) > 1:
        fig["store_mib_per_engine_hour"] = round(grew / (args.engines * hours * (len(rows) - 1) / len(rows)), 1)
    # the recording (steps, per-second rows, scrapes, GPU samples, events) grows with the hours;
    # the snapshots with the faults (here one every interval: far more than a node's day has),
    # so each is stated on its own, and the budget is the recording's
    tables = fig.get("store_tables_mib")
    if tables and hours > 0:
        snap = sum(v for k, v in tables.items() if k in SNAPSHOT_TABLES)
        fig["store_recording_mib_per_engine_hour"] = round((sum(tables.values()) - snap) / (args.engines * hours), 2)
        fig["snapshot_mib_per_fault"] = round(snap / fig["faults"], 2) if fig.get("faults") else None
    cpus = [r["cpu_share"] for r in rows if r.get("cpu_share") is not None]
    restarted = fig.get("restarts")
    per_engine_hour = fig.get("store_mib_per_engine_hour")
    # the figures the benchmark table reads (bench/table.py); None where nothing was measured
    fig["summary"] = {
        "hours": round(hours, 2),
        "rss_first_mib": first_rss,
        "rss_end_mib": end_rss,
        "rss_peak_mib": fig.get("rss_peak_mib"),
        "rss_drift": None if not first_rss or end_rss is None else round(end_rss / first_rss - 1, 4),
        "cpu_share_mean": round(sum(cpus) / len(cpus), 4) if cpus else None,
        "faults": fig.get("faults"),
        "faults_missing": None if fig.get("faults") is None else fig["faults"] - (fig.get("faults_snapshotted") or 0),
        "restarts_total": sum(restarted.values()) if isinstance(restarted, dict) else restarted,
        "store_mib_per_engine_hour": per_engine_hour,
        "store_gb_per_day_8_with_faults": None if per_engine_hour is None else round(per_engine_hour * 2**20 * 8 * 24 / 1e9, 2),
        "store_gb_per_day_8": None if (rec := fig.get("store_recording_mib_per_engine_hour")) is None else round(rec * 2**20 * 8 * 24 / 1e9, 2),
        "snapshot_mib_per_fault": fig.get("snapshot_mib_per_fault"),
        "records_short": None
        if fig.get("step_records_written") is None or fig.get("step_records_received") is None
        else fig["step_records_written"] - fig["step_records_received"],
        "gaps": fig.get("gaps"),
        "lost_bytes": fig.get("lost_bytes"),
    }
    return {
        "every_record_received": fig.get("step_records_written") is not None and fig.get("step_records_received") == fig["step_records_written"],
        # stored once, or counted as thinned (the designed degradation while the sidecar is behind:
        # the rings and the snapshots keep every step; collector/sources/recorder.py)
        "every_step_stored_once": written is not None
        and fig.get("db_step_rows") == fig.get("db_distinct_steps")
        and (fig.get("db_distinct_steps") or 0) + (fig.get("steps_thinned") or 0) == written,
        "every_fault_snapshotted_once": fig.get("faults_snapshotted") == fig.get("faults") == fig.get("xid_snapshots"),
        "no_task_restart": fig.get("restarts") == 0,
        "peak_rss_within_goal": fig.get("rss_peak_mib") is not None and fig["rss_peak_mib"] <= args.rss_goal_mib,
        "rss_flat": first_rss is not None and end_rss is not None and end_rss <= first_rss * (1 + args.rss_drift),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(node.HERE), help="checkout whose sidecar to soak")
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=600.0, help="seconds per figure row, one fault in each")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps-per-second", type=float, default=100.0)
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--rss-goal-mib", type=float, default=200e6 / 2**20, help="peak RSS goal (200 MB)")
    p.add_argument("--rss-drift", type=float, default=0.05, help="the end's RSS at most this much above the first interval's")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, config, database)")
    args = p.parse_args()
    fig = soak(args)
    load = f"{args.engines} x {args.running} x {args.steps_per_second:g}/s"
    print(f"soak: {fig['intervals']} x {args.interval:.0f} s, {load}, {args.db}, commit {fig['commit']}")
    print(f"load (uptime) {fig['load_start']} -> {fig.get('load_end')}")
    print(f"{'minute':>7} {'CPU':>6} {'RSS MiB':>8} {'peak':>6} {'store MiB':>9} {'restarts':>8}")
    for r in fig["per_interval"]:
        print(f"{r['minute']:>7} {100 * r['cpu_share']:>5.1f}% {r['rss_mib']:>8} {r['rss_peak_mib']:>6} {r['store_mib']!s:>9} {r['restarts']!s:>8}")
    print(f"faults {fig.get('faults')}, snapshotted {fig.get('faults_snapshotted')}, fault -> snapshot {fig.get('fault_to_snapshot_ms')}")
    print(f"steps written {fig.get('written_steps')}, records received {fig.get('step_records_received')}")
    print(f"engine_steps rows {fig.get('db_step_rows')} ({fig.get('db_distinct_steps')} distinct), thinned {fig.get('steps_thinned')}")
    print(f"store per engine-hour {fig.get('store_mib_per_engine_hour')} MiB (the files, snapshots included)")
    print(f"recording per engine-hour {fig.get('store_recording_mib_per_engine_hour')} MiB, a snapshot {fig.get('snapshot_mib_per_fault')} MiB")
    print(f"tables (MiB) {fig.get('store_tables_mib')}")
    for name, ok in fig["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2))
    return 0 if all(fig["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
