"""The node-local store's size per engine-hour, and the writer's CPU per 1,000 steps.

    python bench/bench_store_size.py [--engines 8] [--minutes 2] [--running 256] [--steps-per-second 100]
                                     [--db URL] [--json FILE]

Writes ``--engines`` x ``--minutes`` engine-minutes of steps, ``/metrics`` scrapes (a captured
vLLM page, one per engine per ``--scrape-interval``) and GPU samples (one per GPU per second)
through the real writer (``BatchWriter``: ``offer_steps`` with column batches, one flush per
``write_batch_interval`` of simulated time) into a fresh store: a SQLite file by default, or
``--db`` (a Postgres URL: an empty database or schema, migrated here). Steps are shaped like a
busy engine's: ~``--running`` requests with a random walk, a token per running request, a
prefill chunk on some steps, KV usage as used/total blocks, rare preemptions, wall-clock times
with jitter.

Prints each table's growth (and each of its indexes', the migrated empty store's pages taken
off) per engine-hour, the whole file's, and the
store for 8 engines once retention holds it steady (each table at its own horizon; the goal, on
SQLite: <= 2 GB, exit 1 above it); and the writer's CPU (this process, all threads) per
1,000 steps, in a second run with steps only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from collector.columns import INT_NULL, STEP_DTYPE, StepBatch
from collector.model import GpuSample, MetricsScrape
from collector.parsers.prom_text import parse
from collector.settings import RetentionConfig, Settings
from collector.sources.vllm_metrics import WANTED, page_to_scrapes
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter

HERE = Path(__file__).resolve().parents[1]
PAGE = HERE / "tests/fixtures/vllm-metrics/load-running-waiting.txt"
START = 1_780_000_000.0
GOAL_BYTES = 2e9  # the node-local store for 8 busy engines, at the default retention


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


class SimClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Engine:
    """One busy engine's steps, made a tick at a time as a column batch."""

    def __init__(self, name: str, seed: int, running: int, rate: float, hisparse: bool) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.rate = rate
        self.step = 0
        self.run = 4000 + seed
        self.running = running
        self.target = running
        self.waiting = 4
        self.blocks = 12_288
        self.hisparse = hisparse

    def tick(self, t0: float, dt: float) -> StepBatch:
        n = max(1, round(self.rate * dt))
        rng = self.rng
        cols = np.empty(n, dtype=STEP_DTYPE)
        cols["ts"] = START + t0 + (np.arange(n) + rng.random(n) * 0.2) / self.rate
        cols["step"] = np.arange(self.step, self.step + n)
        self.step += n
        cols["run"] = self.run
        walk = np.cumsum(rng.integers(-1, 2, n))
        running = np.clip(self.running + walk, 1, self.target + 8)
        self.running = int(running[-1])
        cols["running"] = running
        waiting = np.clip(self.waiting + np.cumsum(rng.integers(-1, 2, n)), 0, 64)
        self.waiting = int(waiting[-1])
        cols["waiting"] = waiting
        used = np.clip((running * 13 + rng.integers(-40, 40, n)), 0, self.blocks)
        cols["kv_cache_usage"] = used / self.blocks
        cols["preemptions"] = (rng.random(n) < 0.002).astype(np.int32)
        prefill = rng.random(n) < 0.15
        cols["prompt_tokens"] = np.where(prefill, rng.integers(64, 2048, n), 0)
        cols["generation_tokens"] = running - rng.integers(0, 3, n) * prefill
        if self.hisparse:
            cols["mirror_rows"] = running * 4 + rng.integers(0, 8, n)
            cols["host_blocks"] = 9000 + rng.integers(-200, 200, n)
        else:
            cols["mirror_rows"] = INT_NULL
            cols["host_blocks"] = INT_NULL
        return StepBatch(self.name, cols)


def scrape_template() -> dict[str, float]:
    [scrape], _ = page_to_scrapes(parse(PAGE.read_text(), WANTED), name="x", ts=0.0)
    return dict(scrape.values)


def sizes(url: str) -> dict[str, dict[str, int]]:
    """Bytes per table and per each of its indexes, by name (the table's own rows under the
    table's name; SQLite: dbstat pages; Postgres: relation sizes, TOAST with the rows)."""
    db = make_engine(url)
    out: dict[str, dict[str, int]] = {}
    try:
        with db.connect() as conn:
            if db.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                owner: dict[str, str] = dict(conn.exec_driver_sql("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')").all())
                for name, size in conn.exec_driver_sql("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").all():
                    out.setdefault(owner.get(name, name), {})[name] = int(size)
            else:
                rows = conn.exec_driver_sql(
                    "SELECT t.relname, t.relname, pg_table_size(t.oid) FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace "
                    "WHERE t.relkind = 'r' AND n.nspname = current_schema() "
                    "UNION ALL SELECT t.relname, i.relname, pg_relation_size(i.oid) FROM pg_index x "
                    "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
                    "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = current_schema()"
                ).all()
                for table, name, size in rows:
                    out.setdefault(str(table), {})[str(name)] = int(size)
    finally:
        db.dispose()
    return out


async def write(url: str, args: argparse.Namespace, *, scrapes: bool, gpus: bool) -> dict[str, Any]:
    repo = Repository(make_engine(url), host="bench-node")
    clock = SimClock()
    interval = Settings().write_batch_interval
    writer = BatchWriter(repo, interval=interval, clock=clock)
    engines = [Engine(f"decode-{i}", i, args.running, args.steps_per_second, args.hisparse) for i in range(args.engines)]
    template = scrape_template()
    rng = np.random.default_rng(99)
    ticks = round(args.minutes * 60 / interval)
    per_scrape = max(1, round(args.scrape_interval / interval))
    per_gpu = max(1, round(1.0 / interval))
    cpu = 0.0
    steps = 0
    for k in range(ticks):
        t0 = k * interval
        clock.t = t0
        for e in engines:
            batch = e.tick(t0, interval)
            steps += len(batch)
            writer.offer_steps(batch)
            if scrapes and k % per_scrape == 0:
                values = {key: (v + k if "total" in key or key.endswith(("_sum", "_count")) else v) for key, v in template.items()}
                values["num_requests_running"] = float(e.running)
                values["num_requests_waiting"] = float(e.waiting)
                values["kv_cache_usage_perc"] = float(e.running * 13 / e.blocks)
                rates = {"generation_tokens_total": float(e.running) * args.steps_per_second, "prompt_tokens_total": float(rng.integers(0, 30000))}
                writer.offer_scrape(MetricsScrape(engine=e.name, ts=START + t0, values=values, rates=rates))
        if gpus and k % per_gpu == 0:
            for g in range(args.engines):
                writer.offer_gpu(
                    GpuSample(
                        gpu=f"GPU-{g:08d}",
                        index=g,
                        ts=START + t0,
                        bus_id=f"0000:{g:02x}:00.0",
                        name="NVIDIA H100 80GB HBM3",
                        memory_used=int(70e9 + rng.integers(0, 10**9)),
                        memory_total=int(80e9),
                        utilization=float(rng.integers(90, 101)),
                        temperature=float(rng.integers(60, 75)),
                        power_w=float(rng.uniform(500, 700)),
                        sm_clock_mhz=1980.0,
                        clock_event_reasons=0,
                        ecc_volatile_uncorrected=0,
                        remapped_rows_uncorrectable=0,
                        pcie_replay=0,
                    )
                )
        c0 = time.process_time()
        await writer.flush(everything=True)
        cpu += time.process_time() - c0
        if writer.db_up is False:
            raise SystemExit(f"write failed: {writer.last_error}")
    repo.db.dispose()
    return {"steps": steps, "writer_cpu_s": cpu, "cpu_per_1000_steps_ms": 1000.0 * cpu / steps * 1000.0 if steps else None}


def fresh_sqlite(folder: str, name: str) -> str:
    path = Path(folder) / name
    return f"sqlite:///{path}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--minutes", type=float, default=2.0, help="simulated minutes per engine")
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps-per-second", type=float, default=100.0)
    p.add_argument("--scrape-interval", type=float, default=Settings().scrape_interval)
    p.add_argument("--hisparse", action="store_true", help="steps carry host-mirror rows and host blocks")
    p.add_argument("--db", default=None, help="an empty database URL (default: a fresh SQLite file)")
    p.add_argument("--no-cpu", action="store_true", help="skip the steps-only CPU run")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        url = args.db or fresh_sqlite(folder, "size.db")
        upgrade(url)
        empty = sizes(url)  # the migrated store's first pages: not growth
        t0 = time.perf_counter()
        run = asyncio.run(write(url, args, scrapes=True, gpus=True))
        wall = time.perf_counter() - t0
        by_table = {t: {n: b - empty.get(t, {}).get(n, 0) for n, b in parts.items()} for t, parts in sizes(url).items()}  # what the writing added
        file_bytes = None
        if url.startswith("sqlite"):
            path = url.split("///", 1)[1]
            file_bytes = sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s)) - sum(
                sum(p.values()) for p in empty.values()
            )
        cpu = None
        if not args.no_cpu:
            cpu_url = fresh_sqlite(folder, "cpu.db")
            upgrade(cpu_url)
            cpu = asyncio.run(write(cpu_url, args, scrapes=False, gpus=False))

    engine_hours = args.engines * args.minutes / 60.0
    table_bytes = {t: sum(parts.values()) for t, parts in by_table.items()}
    per_eh = {t: b / engine_hours for t, b in sorted(table_bytes.items(), key=lambda kv: -kv[1]) if b}
    total = sum(table_bytes.values())
    retention = RetentionConfig()
    steps_hours = retention.steps_hours
    # each table at its own horizon: the store's size once retention holds it steady
    seconds_hours = float(getattr(retention, "step_seconds_hours", steps_hours))  # a tree before the per-second series has none
    horizon = {"engine_step_seconds": seconds_hours, "gpu_samples": retention.gpu_samples_hours}
    day_8 = sum(b / engine_hours * 8 * horizon.get(t, steps_hours) for t, b in table_bytes.items())
    fig: dict[str, Any] = {
        "engines": args.engines,
        "minutes": args.minutes,
        "running": args.running,
        "steps_per_second": args.steps_per_second,
        "db": "postgresql" if args.db and not args.db.startswith("sqlite") else "sqlite",
        "steps_written": run["steps"],
        "wall_s": round(wall, 2),
        "table_bytes_per_engine_hour": {t: round(b) for t, b in per_eh.items()},
        "parts_bytes_per_engine_hour": {t: {n: round(b / engine_hours) for n, b in parts.items()} for t, parts in by_table.items()},
        "bytes_per_engine_hour": round(total / engine_hours),
        "file_bytes_per_engine_hour": round(file_bytes / engine_hours) if file_bytes is not None else None,
        "steps_hours": steps_hours,
        "step_seconds_hours": seconds_hours,
        "projected_day_8_engines_bytes": round(day_8),  # each table at its own retention
        "writer_cpu_ms_per_1000_steps": round(cpu["cpu_per_1000_steps_ms"], 3) if cpu else None,
        "goal_bytes_8_engines": GOAL_BYTES,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "command": " ".join(["python", "bench/bench_store_size.py", *sys.argv[1:]]),
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}",
    }
    mib = 1024 * 1024
    load = f"{args.engines} engines x {args.minutes:g} min x {args.running} running x {args.steps_per_second:g} steps/s"
    print(f"{load} ({fig['db']}), {run['steps']} steps")
    for t, b in per_eh.items():
        if b / mib < 0.1:
            continue  # a table's first pages: not a rate
        print(f"  {t:<20} {b / mib:9.2f} MiB per engine-hour")
        for name, part in sorted(by_table[t].items(), key=lambda kv: -kv[1]):
            if len(by_table[t]) > 1:
                print(f"    {name:<34} {part / engine_hours / mib:9.2f}")
    print(f"  {'all tables':<20} {total / engine_hours / mib:9.2f} MiB per engine-hour")
    if file_bytes is not None:
        print(f"  {'the file':<20} {file_bytes / engine_hours / mib:9.2f} MiB per engine-hour")
    print(
        f"8 engines, each table at its retention (steps and scrapes {steps_hours:g} h, per second"
        f" {seconds_hours:g} h, GPU samples {retention.gpu_samples_hours:g} h): {day_8 / 1e9:.2f} GB"
    )
    if cpu:
        print(f"writer CPU: {cpu['cpu_per_1000_steps_ms']:.2f} ms per 1,000 steps (steps only), load {fig['loadavg']}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
    return 0 if math.isfinite(total) and (args.db or day_8 <= GOAL_BYTES) else 1


if __name__ == "__main__":
    sys.exit(main())
