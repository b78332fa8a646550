"""Node scale: a real ``flightrec serve`` watching N simulated engines x R running requests x S
steps/s, as on a GPU node, and what it costs.

    python bench/bench_node.py --engines 8 --running 256 --steps-per-second 100 --duration 120
    python bench/bench_node.py --db postgres ...           # a scratch database on the local server
    python bench/bench_node.py --tree ../other-checkout    # measure another commit's sidecar
    python bench/bench_node.py --sweep --duration 30       # engines 1..16, running 16..512: table + PNG
    python bench/bench_node.py --busy 8 --faults 8 ...     # with 8 busy loops beside it (4 per core here)
    python bench/bench_node.py --engine-logs ...           # each engine's log followed too, as the DaemonSet does

What runs (both as child processes, from ``--tree``, default this checkout):
- the load: ``flightrec simulate`` of that tree; a tree without it gets this checkout's load
  model (``collector/sim/load.py``) run over the tree's own recorder channel and codec, so the
  records are those that tree's recorder writes;
- the sidecar: ``flightrec serve`` on the config the load wrote, NVML off, the kernel log a file
  this bench appends Xid lines to, SQLite (a file) or Postgres (a scratch database).

What it measures, in the window after a warm-up:
- sidecar CPU as a share of one core (utime + stime from ``/proc/PID/stat``), in the steady
  half of the window and in the half with faults; peak RSS (``VmHWM``);
- every record received vs written: the sidecar's ``flightrec_steps_received`` (one per step
  half: stats and requests) against the load's count; step rows in ``engine_steps`` (and how
  many duplicate an engine and step); request rows, lag and lost records where the sidecar
  reports them (``/metrics``, ``/healthz``), else null;
- fault to durable snapshot: each fault an Xid line naming one engine's API-server pid (engines
  in turn, a new PCI bus each time, so each is its own incident), timed from the write until the
  snapshot row is in the database (polled every 20 ms); p50/p99/max;
- ingest rows/s: the step rows the sidecar stored per second, beside the best the raw driver
  does on the same table in the same run (``executemany``; ``COPY`` on Postgres).

Prints a table; ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parents[1]
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
FIRST_PID = 41_000  # collector.sim.load.api_pid(i) = FIRST_PID + 100 * i

# Run this checkout's load model on another tree's collector package (a tree without
# `flightrec simulate`): the model's imports resolve to that tree's channel and codec.
DRIVER = """
import importlib.util, sys
here = sys.argv[1]
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod)
    return mod
load("collector.sim.deployment", here + "/collector/sim/deployment.py")
load("collector.sim.load_rings", here + "/collector/sim/load_rings.py")
load("collector.sim.load", here + "/collector/sim/load.py")
load("collector.sim.load_http", here + "/collector/sim/load_http.py")
cli = load("_flightrec_simulate", here + "/collector/cli/simulate.py")
import argparse
p = argparse.ArgumentParser(); cli.add_arguments(p)
sys.exit(cli.main(p.parse_args(sys.argv[2:])))
"""


def step_records(load: dict[str, Any] | None) -> int | None:
    """The step records (halves) the load wrote: its own count, else (a tree before it) a stats
    and a requests record a step. The shutdown's step of aborts has its stats half alone."""
    if not load:
        return None
    given = load.get("step_records")
    return int(given) if given is not None else 2 * int(load["steps"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def proc_status_kib(pid: int, key: str) -> int | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# -- the database -------------------------------------------------------------------------------
class Database:
    """The sidecar's database as this bench sees it: a SQLite file or a scratch Postgres DB."""

    def __init__(self, kind: str, work: Path, pg_admin: str) -> None:
        self.kind = kind
        self._pg_admin = pg_admin
        if kind == "sqlite":
            self.path = work / "flightrec.db"
            self.url = f"sqlite:///{self.path}"
        else:
            import psycopg

            self.pg_name = f"flightrec_bench_{os.getpid()}_{int(time.time())}"
            with psycopg.connect(pg_admin, autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{self.pg_name}"')
            base = pg_admin.rsplit("/", 1)[0]
            self.pg_url = f"{base}/{self.pg_name}"
            self.url = self.pg_url.replace("postgresql://", "postgresql+psycopg://", 1)

    def connect(self) -> Any:
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=30000")
            return conn
        import psycopg

        return psycopg.connect(self.pg_url, autocommit=True)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            return list(conn.execute(sql).fetchall())
        except Exception:  # noqa: BLE001 - a table the sidecar has not made yet
            return []
        finally:
            conn.close()

    def drop(self) -> None:
        if self.kind == "postgres":
            import psycopg

            with psycopg.connect(self._pg_admin, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')


class SnapshotPoller(threading.Thread):
    """Sees each snapshot row as it becomes visible in the database (every 20 ms)."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.seen: list[tuple[float, int, str, str]] = []  # (seen at, id, engine, trigger)
        self.stop = threading.Event()

    def run(self) -> None:
        last = 0
        conn = None
        while not self.stop.is_set():
            try:
                conn = conn or self.db.connect()
                rows = conn.execute(f"SELECT id, engine, trigger_kind FROM snapshots WHERE id > {last} ORDER BY id").fetchall()
                now = time.time()
                for sid, engine, trigger in rows:
                    self.seen.append((now, int(sid), str(engine), str(trigger)))
                    last = max(last, int(sid))
            except Exception:  # noqa: BLE001 - no table yet, or a busy database
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
            self.stop.wait(0.02)
        if conn is not None:
            conn.close()


def step_rows(db: Database) -> list[tuple[int]]:
    """Steps stored, as one row (empty before the tables exist): the chunks' steps (0005 on)
    and the rows of ``engine_steps`` (a tree before 0005, or steps stored before it)."""
    chunks = db.query("SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks")
    rows = db.query("SELECT count(*) FROM engine_steps")
    if not chunks and not rows:
        return []
    return [(int(chunks[0][0] if chunks else 0) + int(rows[0][0] if rows else 0),)]


def step_counts(db: Database) -> tuple[int, int] | None:
    """(steps stored, distinct engine/step keys among them), whichever form the tree stores."""
    if int((db.query("SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") or [(0,)])[0][0]):
        from collector.storage.steps import count_stored_steps  # noqa: PLC0415 - this checkout's reader

        return count_stored_steps(db.url)
    counts = db.query("SELECT count(*), count(DISTINCT engine_id * 10000000000 + run * 100000 + step) FROM engine_steps")
    return (int(counts[0][0]), int(counts[0][1])) if counts else None


def raw_insert_best(db: Database, rows: int = 100_000, repeats: int = 3) -> dict[str, float | None]:
    """The driver's best rows/s into ``engine_steps``, rows shaped like one the sidecar wrote
    (its columns read from the table, so this works on any schema version)."""
    conn = db.connect()
    out: dict[str, float | None] = {"executemany": None, "copy": None}
    try:
        cur = conn.execute("SELECT * FROM engine_steps LIMIT 1")
        cols = [d[0] for d in cur.description]
        template = cur.fetchone()
        if template is None:
            return out
        keep = [i for i, c in enumerate(cols) if c != "id"]
        names = [cols[i] for i in keep]
        step_at = names.index("step")
        base = [template[i] for i in keep]
        first = 10**12  # far above any real step: no clash with a unique (engine, step)

        def batch(k: int) -> list[tuple[Any, ...]]:
            out_rows = []
            for i in range(rows):
                row = list(base)
                row[step_at] = first + k * rows + i
                out_rows.append(tuple(row))
            return out_rows

        mark = "?" if db.kind == "sqlite" else "%s"
        sql = f"INSERT INTO engine_steps ({', '.join(names)}) VALUES ({', '.join([mark] * len(names))})"
        best = 0.0
        for k in range(repeats):
            data = batch(k)
            t0 = time.perf_counter()
            if db.kind == "sqlite":
                conn.execute("BEGIN")
                conn.executemany(sql, data)
                conn.execute("COMMIT")
            else:
                with conn.transaction(), conn.cursor() as c:
                    c.executemany(sql, data)
            best = max(best, rows / (time.perf_counter() - t0))
        out["executemany"] = best
        if db.kind == "postgres":
            best = 0.0
            for k in range(repeats, 2 * repeats):
                data = batch(k)
                t0 = time.perf_counter()
                with conn.transaction(), conn.cursor() as c, c.copy(f"COPY engine_steps ({', '.join(names)}) FROM STDIN") as cp:
                    for row in data:
                        cp.write_row(row)
                best = max(best, rows / (time.perf_counter() - t0))
            out["copy"] = best
        conn.execute(f"DELETE FROM engine_steps WHERE step >= {first}")
    finally:
        conn.close()
    return out


# -- the sidecar's own figures -----------------------------------------------------------------
def scrape_sidecar(base: str) -> dict[str, Any]:
    """Counters from the sidecar's /metrics and /healthz: what it says it received, lost, lags."""
    out: dict[str, Any] = {"steps_received": None, "request_rows_received": None, "lost": None, "lag_s": None, "healthz": None}
    try:
        text = httpx.get(base + "/metrics", timeout=30).text
        out["healthz"] = httpx.get(base + "/healthz", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        out["error"] = repr(exc)
        return out
    sums: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_created",)):
                continue
            sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    out["families"] = {k: v for k, v in sums.items() if any(w in k for w in ("received", "lost", "lag", "behind", "dropped"))}
    out["steps_received"] = sums.get("flightrec_engine_steps_received_total", sums.get("flightrec_steps_received_total"))
    rows = [v for k, v in sums.items() if "request_rows" in k and "received" in k]
    out["request_rows_received"] = rows[0] if rows else None
    out["lost_bytes"] = sums.get("flightrec_recorder_lost_bytes_total", sums.get("flightrec_recorder_lost_bytes"))
    out["lost"] = out["lost_bytes"]
    out["lag_s"] = sums.get("flightrec_recorder_lag_seconds")
    # records dropped unread while a ring was far behind (counted stretches), and set aside
    out["gaps"] = sums.get("flightrec_recorder_gaps_total", sums.get("flightrec_recorder_gaps"))
    out["gap_bytes"] = sums.get("flightrec_recorder_gap_bytes_total", sums.get("flightrec_recorder_gap_bytes"))
    out["bad_records"] = sums.get("flightrec_recorder_bad_records_total", sums.get("flightrec_recorder_bad_records"))
    out["loop_lag_s"] = sums.get("flightrec_loop_lag_seconds")
    return out


# -- engine logs -------------------------------------------------------------------------------
# vLLM's periodic stat line (LoggingStatLogger, every 10 s while an engine is busy), as a real
# engine writes it (tests/fixtures/vllm-logs): at 256 running the rest of its log is quiet.
STAT_LINE = (
    "(APIServer pid={pid}) INFO {stamp} [loggers.py:335] Engine 000: Avg prompt throughput: 2404.0 tokens/s, "
    "Avg generation throughput: 24064.0 tokens/s, Running: 256 reqs, Waiting: 0 reqs, GPU KV cache usage: 61.3%, "
    "Prefix cache hit rate: 0.0%"
)


class EngineLogs(threading.Thread):
    """One log file per engine, a stat line appended to each every 10 s until ``stop``."""

    def __init__(self, folder: Path, engines: int) -> None:
        super().__init__(daemon=True)
        folder.mkdir(parents=True, exist_ok=True)
        self.paths = [folder / f"engine-{i}.log" for i in range(engines)]
        for path in self.paths:
            path.write_text("")
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(10.0):
            stamp = time.strftime("%m-%d %H:%M:%S")
            for i, path in enumerate(self.paths):
                with open(path, "a") as f:
                    f.write(STAT_LINE.format(pid=FIRST_PID + 100 * i, stamp=stamp) + "\n")


# -- one run -----------------------------------------------------------------------------------
@dataclass
class RunConfig:
    tree: Path
    engines: int
    running: int
    steps_per_second: float
    duration: float
    warmup: float
    db: str
    faults: int
    fault_interval: float
    pg_admin: str
    keep: bool = False
    busy: int = 0  # busy-loop processes beside the load (the fault path under CPU pressure)
    engine_logs: bool = False  # each engine's log followed, a vLLM stat line every 10 s in it
    osl: int | None = None  # mean output tokens of the load (None: simulate's default, 256)
    workload_records: bool = True  # the engines write their requests' arrivals and ends (W records)
    scrape_interval: float | None = None  # the sidecar's scrape_interval (None: its default, 1 s)
    start_timeout: float = 300.0  # a loaded machine and an old sidecar can take minutes


@dataclass
class RunResult:
    figures: dict[str, Any] = field(default_factory=dict)


def has_simulate(tree: Path) -> bool:
    return (tree / "collector" / "cli" / "simulate.py").exists()


def reads_workload_records(tree: Path) -> bool:
    """The tree's sidecar reads workload records: binary ``W`` ones, or the JSON ``wl`` ones before."""
    codec = (tree / "collector" / "channel" / "codec.py").read_text()
    return "TAG_WORK" in codec or '"wl"' in codec


def run_once(cfg: RunConfig) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="flightrec-bench-node-"))
    recorder = Path(tempfile.mkdtemp(prefix="flightrec-bench-rings-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    sim_config, summary = work / "sim.yaml", work / "summary.json"
    kmsg = work / "kmsg.log"
    kmsg.write_text("")
    env = {**os.environ, "PYTHONPATH": str(cfg.tree), "PYTHONUNBUFFERED": "1"}
    sim_args = [
        "--engines",
        str(cfg.engines),
        "--running",
        str(cfg.running),
        "--steps-per-second",
        str(cfg.steps_per_second),
        "--duration",
        str(cfg.warmup + cfg.duration),
        "--recorder-dir",
        str(recorder),
        "--write-config",
        str(sim_config),
        "--serve-metrics",
        "--start-delay",
        "8",
        "--linger",
        "--summary-json",
        str(summary),
        "--progress-every",
        "30",
    ]
    if not reads_workload_records(cfg.tree) or not cfg.workload_records:
        sim_args.append("--no-workload-records")
    if cfg.osl is not None:
        sim_args += ["--osl", str(cfg.osl)]
    if has_simulate(cfg.tree):
        sim_cmd = [PY, "-m", "collector.cli", "simulate", *sim_args]
        driver = "flightrec simulate"
    else:
        sim_cmd = [PY, "-c", DRIVER, str(HERE), *sim_args]
        driver = "built-in (this checkout's load model over the tree's channel writer)"
    db = Database(cfg.db, work, cfg.pg_admin)
    sim_log, side_log = open(work / "simulate.log", "w"), open(work / "sidecar.log", "w")
    busy = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(cfg.busy)]
    logs = EngineLogs(work / "logs", cfg.engines) if cfg.engine_logs else None
    sim = subprocess.Popen(sim_cmd, cwd=cfg.tree, env=env, stdout=sim_log, stderr=subprocess.STDOUT)
    side: subprocess.Popen[bytes] | None = None
    poller = SnapshotPoller(db)
    fig: dict[str, Any] = {
        "engines": cfg.engines,
        "running": cfg.running,
        "steps_per_second": cfg.steps_per_second,
        "duration_s": cfg.duration,
        "db": cfg.db,
        "busy_loops": cfg.busy,
        "engine_logs": cfg.engine_logs,
        "driver": driver,
        "tree": str(cfg.tree),
    }
    try:
        t_sim = time.time()
        while not sim_config.exists():
            if sim.poll() is not None or time.time() - t_sim > 60:
                raise RuntimeError(f"the load did not start; see {work / 'simulate.log'}")
            time.sleep(0.05)
        doc = yaml.safe_load(sim_config.read_text())
        port = free_port()
        doc.update(
            database=db.url,
            port=port,
            host="127.0.0.1",
            kmsg=str(kmsg),
            nvml="off",
            incident_window_s=max(1.0, cfg.fault_interval * cfg.engines / 2),
            host_name="bench-node",
        )
        if cfg.scrape_interval is not None:
            doc["scrape_interval"] = cfg.scrape_interval
        if logs is not None:
            for engine, path in zip(doc.get("engines") or [], logs.paths, strict=False):
                engine["log"] = str(path)
            logs.start()
        side_config = work / "sidecar.yaml"
        side_config.write_text(yaml.safe_dump(doc))
        side = subprocess.Popen(
            [PY, "-m", "collector.cli", "serve", "--config", str(side_config)], cwd=cfg.tree, env=env, stdout=side_log, stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{port}"
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            if side.poll() is not None or time.time() - t_sim > cfg.start_timeout:
                raise RuntimeError(f"the sidecar did not start; see {work / 'sidecar.log'}")
            time.sleep(0.1)
        fig["sidecar_ready_after_config_s"] = round(time.time() - t_sim, 1)
        poller.start()
        # The load's first step is 8 s after its config; measure after the warm-up.
        t_a = t_sim + 8 + cfg.warmup
        time.sleep(max(0.0, t_a - time.time()))
        fig["load_start"] = loadavg()
        cpu_a, wall_a = proc_cpu_s(side.pid), time.time()
        rows_a = step_rows(db)
        half = cfg.duration / 2 if cfg.faults else cfg.duration
        time.sleep(max(0.0, wall_a + half - time.time()))
        cpu_m, wall_m = proc_cpu_s(side.pid), time.time()
        faults: list[tuple[float, str]] = []
        seq = 9000
        for k in range(cfg.faults):
            due = wall_m + k * cfg.fault_interval
            time.sleep(max(0.0, due - time.time()))
            engine_i = k % cfg.engines
            seq += 1
            bus = f"0000:{(k % 200) + 16:02x}:00"
            line = (
                f"4,{seq},{int(time.monotonic() * 1e6)},c;NVRM: Xid (PCI:{bus}): 43, "
                f"pid={FIRST_PID + 100 * engine_i}, name=python3, channel 0x0000000a"
            )
            t0 = time.time()
            with open(kmsg, "a") as f:
                f.write(line + "\n")
            faults.append((t0, engine_name(doc, engine_i)))
        time.sleep(max(0.0, wall_a + cfg.duration - time.time()))
        cpu_b, wall_b = proc_cpu_s(side.pid), time.time()
        rows_b = step_rows(db)
        fig["load_end"] = loadavg()
        fig["sidecar_cpu_share"] = round((cpu_b - cpu_a) / (wall_b - wall_a), 4)
        fig["sidecar_cpu_share_steady"] = round((cpu_m - cpu_a) / (wall_m - wall_a), 4)
        if cfg.faults:
            fig["sidecar_cpu_share_faults"] = round((cpu_b - cpu_m) / max(wall_b - wall_m, 1e-9), 4)
        fig["sidecar_rss_now_mib"] = round((proc_status_kib(side.pid, "VmRSS") or 0) / 1024, 1)
        at_end = scrape_sidecar(base)  # while the load still runs: how far behind is it?
        fig["at_window_end"] = {k: at_end.get(k) for k in ("steps_received", "request_rows_received", "lag_s", "loop_lag_s", "lost_bytes")}
        # the load ends (idle engines, still up); give the sidecar time to catch up
        t_end = time.time()
        while not summary.exists() and time.time() - t_end < 60:
            time.sleep(0.1)
        fig["load"] = json.loads(summary.read_text()) if summary.exists() else None
        written = fig["load"]["steps"] if fig["load"] else None
        records = step_records(fig["load"])
        caught_up_at = None
        last_scrape: dict[str, Any] = {}
        while time.time() - t_end < 60:
            last_scrape = scrape_sidecar(base)
            if (
                written is not None
                and last_scrape.get("steps_received") is not None
                and records is not None
                and last_scrape["steps_received"] >= records
            ):
                caught_up_at = time.time()
                break
            time.sleep(1.0)
        time.sleep(2.0)
        last_scrape = scrape_sidecar(base)
        fig["sidecar_rss_peak_mib"] = round((proc_status_kib(side.pid, "VmHWM") or 0) / 1024, 1)
        fig["caught_up_after_load_end_s"] = None if caught_up_at is None else round(caught_up_at - t_end, 1)
        fig["written_steps"] = written
        fig["written_request_rows"] = fig["load"]["request_rows"] if fig["load"] else None
        fig["sidecar"] = {k: v for k, v in last_scrape.items() if k != "healthz"}
        fig["healthz"] = last_scrape.get("healthz")
        fig["step_records_received"] = last_scrape.get("steps_received")
        fig["step_records_written"] = records
        fig["request_rows_received"] = last_scrape.get("request_rows_received")
        counts = step_counts(db)
        if counts:
            fig["db_step_rows"], fig["db_distinct_steps"] = counts
            fig["db_duplicate_steps"] = fig["db_step_rows"] - fig["db_distinct_steps"]
        if rows_a and rows_b:
            fig["ingest_step_rows_per_s"] = round((rows_b[0][0] - rows_a[0][0]) / (wall_b - wall_a), 1)
        fig["offered_step_rows_per_s"] = cfg.engines * cfg.steps_per_second
        fig["offered_request_rows_per_s"] = cfg.engines * cfg.steps_per_second * cfg.running
        # fault -> durable snapshot
        poller.stop.set()
        poller.join(5)
        used: set[int] = set()
        lat: list[float] = []
        missing = 0
        for t0, engine in faults:
            hit = next((s for s in poller.seen if s[2] == engine and s[0] >= t0 and s[1] not in used), None)
            if hit is None:
                missing += 1
                continue
            used.add(hit[1])
            lat.append(hit[0] - t0)
        fig["faults"] = len(faults)
        fig["faults_without_snapshot"] = missing
        fig["fault_to_snapshot_ms"] = {
            q: (None if pct(lat, p) is None else round(1000 * pct(lat, p), 1))  # type: ignore[operator]
            for q, p in (("p50", 50), ("p99", 99))
        }
        fig["fault_to_snapshot_ms"]["max"] = round(1000 * max(lat), 1) if lat else None
        fig["snapshots_by_trigger"] = {}
        for s in poller.seen:
            fig["snapshots_by_trigger"][s[3]] = fig["snapshots_by_trigger"].get(s[3], 0) + 1
    finally:
        poller.stop.set()
        if logs is not None:
            logs.stop.set()
        for b in busy:
            b.kill()
            b.wait()
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
        try:
            if "db_step_rows" in fig:
                fig["raw_driver_rows_per_s"] = raw_insert_best(db)
        finally:
            if not cfg.keep:  # a failed run leaves nothing behind either
                db.drop()
                shutil.rmtree(recorder, ignore_errors=True)
                shutil.rmtree(work, ignore_errors=True)
            else:
                fig["workdir"] = str(work)
    return fig


def engine_name(doc: dict[str, Any], i: int) -> str:
    engines = doc.get("engines") or []
    return str(engines[i]["name"]) if i < len(engines) else f"vllm-{FIRST_PID + 100 * i}"


# -- output ------------------------------------------------------------------------------------
def fmt(v: Any, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return f"{v * scale:,.{digits}f}{unit}"
    return str(v)


def table(fig: dict[str, Any]) -> str:
    load = fig.get("load") or {}
    f2s = fig.get("fault_to_snapshot_ms") or {}
    raw = fig.get("raw_driver_rows_per_s") or {}
    rows = [
        (
            "load",
            (f"{fig['engines']} engines x {fig['running']} running x {fig['steps_per_second']:g} steps/s, {fig['duration_s']:g} s, {fig['db']}"),
        ),
        ("driver", fig["driver"]),
        (
            "load achieved",
            (
                f"{fmt(load.get('steps_per_s'))} steps/s, {fmt(load.get('rows_per_s'), digits=0)} request rows/s, "
                f"simulator CPU {fmt(load.get('cpu_share'), '%', 100)}"
            ),
        ),
        ("machine load (uptime)", f"{fig.get('load_start')} -> {fig.get('load_end')}, busy loops {fig.get('busy_loops', 0)}"),
        (
            "sidecar CPU, share of one core",
            (
                f"{fmt(fig.get('sidecar_cpu_share'), '%', 100)} (steady "
                f"{fmt(fig.get('sidecar_cpu_share_steady'), '%', 100)}, with faults "
                f"{fmt(fig.get('sidecar_cpu_share_faults'), '%', 100)})"
            ),
        ),
        ("sidecar peak RSS (VmHWM)", fmt(fig.get("sidecar_rss_peak_mib"), " MiB")),
        (
            "step records received / written",
            (f"{fmt(fig.get('step_records_received'), digits=0)} / {fmt(fig.get('step_records_written'), digits=0)}"),
        ),
        (
            "request rows received / written",
            (f"{fmt(fig.get('request_rows_received'), digits=0)} / {fmt(fig.get('written_request_rows'), digits=0)}"),
        ),
        (
            "engine_steps rows (distinct) / steps written",
            (f"{fmt(fig.get('db_step_rows'), digits=0)} ({fmt(fig.get('db_distinct_steps'), digits=0)}) / {fmt(fig.get('written_steps'), digits=0)}"),
        ),
        (
            "recorder lag / loop lag / lost ring bytes",
            (
                f"{fmt((fig.get('sidecar') or {}).get('lag_s'), ' s', digits=2)} / "
                f"{fmt((fig.get('sidecar') or {}).get('loop_lag_s'), ' s', digits=2)} / "
                f"{fmt((fig.get('sidecar') or {}).get('lost_bytes'), digits=0)}"
            ),
        ),
        (
            "at the window's end: recorder lag / loop lag",
            (
                f"{fmt((fig.get('at_window_end') or {}).get('lag_s'), ' s', digits=2)} / "
                f"{fmt((fig.get('at_window_end') or {}).get('loop_lag_s'), ' s', digits=2)}"
            ),
        ),
        ("caught up after the load stopped", fmt(fig.get("caught_up_after_load_end_s"), " s")),
        (
            "fault -> durable snapshot",
            (
                f"p50 {fmt(f2s.get('p50'), ' ms')}, p99 {fmt(f2s.get('p99'), ' ms')}, "
                f"max {fmt(f2s.get('max'), ' ms')} over {fig.get('faults', 0)} faults "
                f"({fig.get('faults_without_snapshot', 0)} without a snapshot)"
            ),
        ),
        ("snapshots by trigger", json.dumps(fig.get("snapshots_by_trigger") or {})),
        ("ingest step rows/s: sidecar / offered", (f"{fmt(fig.get('ingest_step_rows_per_s'))} / {fmt(fig.get('offered_step_rows_per_s'))}")),
        ("raw driver best rows/s (executemany / COPY)", (f"{fmt(raw.get('executemany'), digits=0)} / {fmt(raw.get('copy'), digits=0)}")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Engines 1..16 at 256 running, then running 16..512 at 8 engines; a point that fails is
    kept with its error (the others still run)."""
    engines = [int(x) for x in args.sweep_engines.split(",")]
    running = [int(x) for x in args.sweep_running.split(",")]
    points = [(e, 256) for e in engines] + [(8, r) for r in running if (8, r) not in [(e, 256) for e in engines]]
    out = []
    for n_engines, n_running in points:
        try:
            fig = run_once(config(args, engines=n_engines, running=n_running, faults=0))
        except Exception as exc:  # noqa: BLE001 - one bad point must not lose the sweep
            fig = {"engines": n_engines, "running": n_running, "error": repr(exc)}
        print(
            f"engines {n_engines:>2} x running {n_running:>3}: CPU {fmt(fig.get('sidecar_cpu_share'), '%', 100)}, "
            f"peak RSS {fmt(fig.get('sidecar_rss_peak_mib'), ' MiB')}, load {fig.get('load_start')}"
            f"{'  ERROR ' + fig['error'] if 'error' in fig else ''}",
            flush=True,
        )
        out.append(fig)
        if args.json:  # partial results survive an interrupted sweep
            Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return out


def sweep_table(figs: list[dict[str, Any]]) -> str:
    lines = [
        "| engines | running | steps/s (all) | sidecar CPU | peak RSS | records received / written | load (1 min) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for f in figs:
        if "error" in f:
            lines.append(f"| {f['engines']} | {f['running']} | failed: {f['error'][:60]} | | | | |")
            continue
        load = f.get("load") or {}
        lines.append(
            f"| {f['engines']} | {f['running']} | {fmt(load.get('steps_per_s'))} | "
            f"{fmt(f.get('sidecar_cpu_share'), '%', 100)} | {fmt(f.get('sidecar_rss_peak_mib'), ' MiB')} | "
            f"{fmt(f.get('step_records_received'), digits=0)} / {fmt(f.get('step_records_written'), digits=0)} | "
            f"{f.get('load_start')} |"
        )
    return "\n".join(lines)


def plot(figs: list[dict[str, Any]], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install '.[bench]'): no plot", file=sys.stderr)
        return False
    ok = [f for f in figs if "error" not in f]
    by_engines = sorted((f for f in ok if f["running"] == 256), key=lambda f: f["engines"])
    by_running = sorted((f for f in ok if f["engines"] == 8), key=lambda f: f["running"])
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, (series, key, label) in enumerate(
        ((by_engines, "engines", "engines (256 running each)"), (by_running, "running", "running requests (8 engines)"))
    ):
        xs = [f[key] for f in series]
        axes[0][col].plot(xs, [100 * (f.get("sidecar_cpu_share") or 0) for f in series], "o-")
        axes[0][col].set_ylabel("sidecar CPU, % of one core")
        axes[1][col].plot(xs, [f.get("sidecar_rss_peak_mib") or 0 for f in series], "o-", color="tab:red")
        axes[1][col].set_ylabel("peak RSS, MiB")
        for row in (0, 1):
            axes[row][col].set_xlabel(label)
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def config(args: argparse.Namespace, **over: Any) -> RunConfig:
    base = {
        "tree": Path(args.tree).resolve(),
        "engines": args.engines,
        "running": args.running,
        "steps_per_second": args.steps_per_second,
        "duration": args.duration,
        "warmup": args.warmup,
        "db": args.db,
        "faults": args.faults,
        "fault_interval": args.fault_interval,
        "pg_admin": args.pg_admin,
        "keep": args.keep,
        "busy": args.busy,
        "engine_logs": args.engine_logs,
        "osl": args.osl,
        "workload_records": not args.no_workload_records,
        "scrape_interval": args.scrape_interval,
    }
    base.update(over)
    return RunConfig(**base)  # type: ignore[arg-type]


def tree_commit(tree: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(HERE), help="checkout whose sidecar (and simulate) to measure")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps-per-second", type=float, default=100.0)
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds, after the warm-up")
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument(
        "--pg-admin", default=os.environ.get("FLIGHTREC_BENCH_PG", PG_ADMIN), help="a Postgres URL allowed to CREATE DATABASE (a scratch one per run)"
    )
    p.add_argument("--faults", type=int, default=20, help="Xid faults in the second half of the window")
    p.add_argument("--fault-interval", type=float, default=2.5, help="seconds between faults (engines in turn)")
    p.add_argument("--sweep", action="store_true", help="engines 1..16 at 256 running, running 16..512 at 8 engines")
    p.add_argument("--sweep-engines", default="1,2,4,8,16", help="engine counts at 256 running")
    p.add_argument("--sweep-running", default="16,64,256,512", help="running requests at 8 engines")
    p.add_argument("--out", default=".", help="folder for the sweep's PNG and table")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, config, database)")
    p.add_argument("--busy", type=int, default=0, help="busy-loop processes running beside the load the whole run (e.g. 4 per core)")
    p.add_argument(
        "--osl",
        type=int,
        help="mean output tokens a request (the running set changes about running/osl times a step; default: simulate's 256)",
    )
    p.add_argument("--no-workload-records", action="store_true", help="the engines write no W records (what they cost the sidecar)")
    p.add_argument("--scrape-interval", type=float, help="the sidecar's scrape_interval in seconds (default: its own, 1 s; what the scrapes cost)")
    p.add_argument(
        "--engine-logs",
        action="store_true",
        help="each engine's log followed (a file per engine, a vLLM stat line in each every 10 s), as the DaemonSet does",
    )
    args = p.parse_args()
    tree = Path(args.tree).resolve()
    print(f"bench_node: tree {tree.name} @ {tree_commit(tree)}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load {loadavg()}", flush=True)
    if args.sweep:
        figs = sweep(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        md = sweep_table(figs)
        (out / "bench_node_sweep.md").write_text(md + "\n")
        print(md)
        if plot(
            figs, out / "bench_node_sweep.png", f"flightrec serve @ {tree_commit(tree)}, {args.db}, {args.steps_per_second:g} steps/s per engine"
        ):
            print(f"plot: {out / 'bench_node_sweep.png'}")
        result: Any = figs
    else:
        result = run_once(config(args))
        print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
