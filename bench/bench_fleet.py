"""A fleet on one machine: N real sidecars (``flightrec serve``, one process per node, the split
placement: a node-local SQLite each, one shared Postgres) with a simulated engine each, written
through the real recorder path (``collector.sim.load.EngineLoad``: the channel's ring files the
sidecar reads), then a fault storm: one Xid per node within ``--storm-s`` seconds, written to
each node's kernel-log file as the kernel writes it.

Scaled down per node so that a 2-core machine shared with others carries 32 of them: one engine
per node (a GPU node runs 8), ``--steps-per-second`` 10 (100) and ``--running`` 8 (256), no NVML
(no GPU series), and the sidecars share ``--procs`` Python processes (each node a whole
``Service`` of its own: its own stores, connection pools, outbox, spool, committer and HTTP
server; only the interpreter is shared), since 32 interpreters importing the service at once
did not start within 3 minutes on this machine at a load of 30-40. What the shared store receives from a node does not depend on the step rate
(per-step rows stay on the node): it is one coarse row per engine (and GPU) per 10 s, the
events, and the snapshots, whose size follows the ring (``--ring-steps``) and the running
requests. docs/fleet.md scales these figures to a real node and to 1,000 and 10,000 nodes.

Measured, printed, and written with ``--json``:
- every snapshot stored: each node's Xid, in the shared store, and how long after the Xid line
  (polled every 0.2 s from this process: p50, p99, max);
- write p99: each sidecar's commit time per outbox batch (its log at stop), and the storm's
  snapshot commits;
- rows/s into the shared store (``pg_stat_user_tables``), steady and during the storm;
- the shared store's CPU (its processes' utime+stime from /proc) and disk (database size and WAL
  bytes), as seconds and bytes per node per hour.

The shared store is a Postgres cluster of its own (initdb on a free port, fsync on), so its CPU
and disk are this run's alone; the machine's load is printed with the figures.

    PYTHONPATH=. .venv/bin/python bench/bench_fleet.py --nodes 32 --duration 60 --json fleet.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import outage  # noqa: E402  (scripts/outage.py: a Postgres cluster of our own)

from collector.sim.load import EngineLoad, LoadConfig, run  # noqa: E402

# even nodes: the software fault (Xid 43, a kernel that stopped); odd nodes: a GPU lost (Xid 79)
XIDS = (
    "4,{seq},{us},-;NVRM: Xid (PCI:0000:18:00): 43, pid=3107, name=python3, Ch 00000010",
    "4,{seq},{us},-;NVRM: Xid (PCI:0000:18:00): 79, pid=3107, name=python3, GPU has fallen off the bus.",
)
FAULT_KINDS = "('xid', 'gpu_lost')"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def pg_figures(cluster: outage.Cluster) -> dict[str, float]:
    row = cluster.query(
        "SELECT (SELECT COALESCE(SUM(n_tup_ins), 0) FROM pg_stat_user_tables), pg_database_size('flightrec'), "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
    )[0]
    return {"rows": float(row[0]), "db_bytes": float(row[1]), "wal_bytes": float(row[2]), "cpu_s": proc_cpu_s(cluster.pids()), "t": time.monotonic()}


def rate(a: dict[str, float], b: dict[str, float], nodes: int) -> dict[str, float]:
    wall = b["t"] - a["t"]
    per_node_hour = 3600.0 / wall / nodes
    return {
        "wall_s": round(wall, 1),
        "rows_per_s": round((b["rows"] - a["rows"]) / wall, 1),
        "pg_cpu_cores": round((b["cpu_s"] - a["cpu_s"]) / wall, 4),
        "pg_cpu_s_per_node_hour": round((b["cpu_s"] - a["cpu_s"]) * per_node_hour, 2),
        "db_bytes_per_node_hour": round((b["db_bytes"] - a["db_bytes"]) * per_node_hour),
        "wal_bytes_per_node_hour": round((b["wal_bytes"] - a["wal_bytes"]) * per_node_hour),
        "rows_per_node_hour": round((b["rows"] - a["rows"]) * per_node_hour),
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


class Node:
    def __init__(self, work: Path, i: int, shared: str, args: argparse.Namespace) -> None:
        self.i, self.host = i, f"node-{i:02d}"
        self.dir = work / self.host
        self.rec = self.dir / "rec"
        self.rec.mkdir(parents=True)
        self.kmsg = self.dir / "kmsg.log"
        self.kmsg.write_text("")
        self.log = self.dir / "sidecar.log"
        self.config = self.dir / "flightrec.yaml"
        settings = {
            "database": {"local": f"sqlite:///{self.dir / 'node.db'}", "shared": shared},
            "host_name": self.host,
            "recorder_dir": str(self.rec),
            "kmsg": str(self.kmsg),
            "nvml": "off",
            "port": 0,
            "spool_dir": str(self.dir / "spool"),
            "ring_steps": args.ring_steps,
            "write_batch_interval": 1.0,
            "retention": {"interval_s": 60.0},
        }
        self.config.write_text(yaml.safe_dump(settings))
        self.cfg = LoadConfig(recorder_dir=self.rec, engines=1, running=args.running, steps_per_second=args.steps_per_second, name="decode-0", seed=i)
        self.proc: subprocess.Popen[bytes] | None = None
        self.xid_at: float | None = None

    def start(self) -> None:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}, "PYTHONPATH": str(ROOT)}
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "collector.cli", "serve", "--config", str(self.config)],
                cwd=self.dir,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    def started(self) -> bool:
        return (self.dir / "serving").exists() or (self.log.exists() and "serving on http://" in self.log.read_text(errors="replace"))

    def fault(self) -> None:
        self.xid_at = time.time()
        us = int(time.monotonic() * 1e6)
        with open(self.kmsg, "a") as f:
            f.write(XIDS[self.i % 2].format(seq=1000 + self.i, us=us) + "\n")

    def forwarder(self) -> dict[str, Any] | None:
        done = self.dir / "forwarder.json"  # a node run in a shared worker process
        if not self.log.exists() and not done.exists():
            return None
        if done.exists():
            return json.loads(done.read_text())  # type: ignore[no-any-return]
        for line in self.log.read_text(errors="replace").splitlines():
            if "fleet forwarder: " in line:
                return json.loads(line.split("fleet forwarder: ", 1)[1])  # type: ignore[no-any-return]
        return None


def worker(configs: list[str]) -> int:
    """Several nodes' sidecars in one process: a ``Service`` each, on one loop, until SIGTERM."""
    import asyncio
    import logging

    from collector.service import Service
    from collector.settings import load_settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def all_nodes() -> None:
        services = [Service(load_settings(c)) for c in configs]
        tasks = []
        for svc, c in zip(services, configs, strict=True):  # one at a time: Alembic's context is process-wide
            tasks.append(asyncio.create_task(svc.run()))
            started = asyncio.create_task(svc.started.wait())
            await asyncio.wait([tasks[-1], started], return_when=asyncio.FIRST_COMPLETED)
            if tasks[-1].done():
                raise SystemExit(f"{c}: the sidecar stopped at start: {tasks[-1].exception()!r}")
            (Path(c).parent / "serving").write_text("")
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        for svc in services:
            svc.request_stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for svc, c in zip(services, configs, strict=True):
            rows = svc.rows
            if rows is not None and hasattr(rows, "figures"):
                (Path(c).parent / "forwarder.json").write_text(json.dumps(rows.figures()))

    asyncio.run(all_nodes())
    return 0


def start_workers(nodes: list[Node], procs: int, work: Path) -> list[subprocess.Popen[bytes]]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}, "PYTHONPATH": str(ROOT)}
    out = []
    for k in range(procs):
        mine = [str(n.config) for n in nodes[k::procs]]
        with open(work / f"worker-{k}.log", "wb") as f:
            out.append(subprocess.Popen([sys.executable, __file__, "--worker", *mine], env=env, stdout=f, stderr=subprocess.STDOUT))
        for n in nodes[k::procs]:
            n.proc = out[-1]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--running", type=int, default=8, help="running requests per engine step (a real node: 256)")
    p.add_argument("--steps-per-second", type=float, default=10.0, help="per engine (a real engine: 100)")
    p.add_argument("--ring-steps", type=int, default=1024, help="steps each snapshot holds at most")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of steady load measured before the storm")
    p.add_argument("--storm-s", type=float, default=10.0, help="the storm's faults fall within this many seconds")
    p.add_argument("--wait", type=float, default=180.0, help="seconds to wait for every snapshot")
    p.add_argument("--procs", type=int, default=4, help="processes the sidecars share (0: one process per sidecar)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)

    load0 = outage.loadavg()
    work = Path(tempfile.mkdtemp(prefix="flightrec-fleet-"))
    os.chmod(work, 0o755)
    pg_dir = work / "pg"
    pg_dir.mkdir()
    cluster = outage.Cluster(pg_dir)
    nodes: list[Node] = []
    stop = threading.Event()
    try:
        # fsync on (a shared store's real disk cost); connections for 32+ sidecars' pools
        cluster.stop()
        cluster.opts = cluster.opts.replace("-c fsync=off", "-c fsync=on").replace("max_connections=60", "max_connections=400")
        cluster.start()
        from collector.storage.migrate import upgrade

        upgrade(cluster.url)  # once, before the sidecars (each would migrate at start)
        nodes = [Node(work, i, cluster.url, args) for i in range(args.nodes)]
        engines = [EngineLoad(n.cfg, 0) for n in nodes]
        pacing = LoadConfig(recorder_dir=work, engines=1, steps_per_second=args.steps_per_second, duration=None)
        driver = threading.Thread(target=run, args=(engines, pacing, stop), kwargs={"progress_every": 0}, daemon=True)
        driver.start()
        t_start = time.monotonic()
        if args.procs > 0:
            workers = start_workers(nodes, args.procs, work)
        else:
            for n in nodes:
                n.start()
                time.sleep(0.2)
            workers = [n.proc for n in nodes if n.proc is not None]
        deadline = time.monotonic() + 240
        while not all(n.started() for n in nodes):
            dead = [n.host for n in nodes if n.proc is not None and n.proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = "".join(f.read_text(errors="replace")[-2000:] for f in sorted(work.glob("worker-*.log")))
                raise SystemExit(f"sidecars did not start: {dead or 'timeout'}\n{tails}")
            time.sleep(0.5)
        started_s = time.monotonic() - t_start
        print(f"{args.nodes} sidecars serving after {started_s:.0f} s; steady load for {args.duration:.0f} s", flush=True)
        time.sleep(15)  # the first coarse intervals close, the first outbox rounds ship
        a = pg_figures(cluster)
        side_a = proc_cpu_s([w.pid for w in workers])
        time.sleep(args.duration)
        b = pg_figures(cluster)
        side_b = proc_cpu_s([w.pid for w in workers])
        steady = rate(a, b, args.nodes)
        print(f"steady: {json.dumps(steady)}", flush=True)

        # the storm: one Xid per node, at random moments within storm_s
        rng = random.Random(7)
        offsets = sorted(((rng.uniform(0, args.storm_s), n) for n in nodes), key=lambda x: x[0])
        seen: dict[str, float] = {}
        polling = threading.Event()

        def poll() -> None:  # from before the first fault: each snapshot's first sighting
            while not polling.is_set():
                for (host,) in cluster.query(f"SELECT DISTINCT host FROM snapshots WHERE trigger_kind IN {FAULT_KINDS}"):
                    seen.setdefault(host, time.time())
                time.sleep(0.2)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.monotonic()
        for off, n in offsets:
            while time.monotonic() - t0 < off:
                time.sleep(0.01)
            n.fault()
        stored_wait = time.monotonic() + args.wait
        while len(seen) < len(nodes) and time.monotonic() < stored_wait:
            time.sleep(0.2)
        polling.set()
        poller.join(10)
        time.sleep(3.0)  # each snapshot's amendment (snapshot_settle_s after its capture) lands too
        c = pg_figures(cluster)
        storm = {
            "wall_s": round(c["t"] - b["t"], 1),
            "rows": int(c["rows"] - b["rows"]),
            "pg_cpu_s": round(c["cpu_s"] - b["cpu_s"], 2),
            "db_bytes": int(c["db_bytes"] - b["db_bytes"]),
            "wal_bytes": int(c["wal_bytes"] - b["wal_bytes"]),
        }
        latency = [seen[n.host] - n.xid_at for n in nodes if n.host in seen and n.xid_at is not None]
        snaps = cluster.query(
            "SELECT COUNT(*), COUNT(DISTINCT host), COALESCE(SUM(step_count), 0), COALESCE(SUM(request_rows), 0), "
            "COALESCE(SUM((SELECT SUM(octet_length(payload)) FROM snapshot_parts p WHERE p.snapshot_id = s.id)), 0) "
            f"FROM snapshots s WHERE trigger_kind IN {FAULT_KINDS}"
        )[0]
        kinds = dict(cluster.query("SELECT trigger_kind, COUNT(*) FROM snapshots GROUP BY 1"))
        dup = cluster.query("SELECT COUNT(*) - COUNT(DISTINCT (host, engine, trigger_uid)) FROM snapshots")[0][0]
        series = cluster.query("SELECT COUNT(*), COALESCE(SUM(steps), 0) FROM engine_series")[0]
        # each table's bytes (its partitions' too), and the engine_series bytes per row
        sizes = dict(
            cluster.query(
                "SELECT t, SUM(pg_total_relation_size(c.oid)) FROM (VALUES ('engine_series'), ('events'), ('engines'), ('snapshots'), "
                "('snapshot_parts'), ('incidents')) v(t) JOIN pg_class c ON c.relname = v.t OR c.oid IN "
                "(SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(v.t)) GROUP BY t"
            )
        )
        partitions = [
            r[0] for r in cluster.query("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relkind = 'r' ORDER BY 1")
        ]
        stop.set()
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.wait(120)
        fw = [f for f in (n.forwarder() for n in nodes) if f]
        ship_p99 = [f["ship_p99_s"] for f in fw if f.get("ship_p99_s") is not None]
        figures = {
            "nodes": args.nodes,
            "procs": args.procs,
            "per_node": {"engines": 1, "running": args.running, "steps_per_second": args.steps_per_second, "ring_steps": args.ring_steps, "gpus": 0},
            "started_s": round(started_s, 1),
            "steady": steady,
            "sidecars_cpu_cores": round((side_b - side_a) / steady["wall_s"], 3),
            "storm": {
                **storm,
                "faults": args.nodes,
                "within_s": args.storm_s,
                "snapshots_stored": int(snaps[0]),
                "nodes_with_snapshot": int(snaps[1]),
                "duplicate_snapshots": int(dup),
                "snapshots_by_trigger": kinds,
                "fault_to_stored_p50_s": pct(latency, 0.5),
                "fault_to_stored_p99_s": pct(latency, 0.99),
                "fault_to_stored_max_s": pct(latency, 1.0),
                "snapshot_steps_mean": round(snaps[2] / max(snaps[0], 1)),
                "snapshot_request_rows_mean": round(snaps[3] / max(snaps[0], 1)),
                "snapshot_bytes_mean": round(snaps[4] / max(snaps[0], 1)),
            },
            "outbox_ship": {
                "sidecars_reporting": len(fw),
                "batches": sum(f["batches_shipped"] for f in fw),
                "rows": sum(f["rows_shipped"] for f in fw),
                "p99_of_sidecar_p99_s": pct(ship_p99, 0.99),
                "max_s": max((f["ship_max_s"] or 0.0) for f in fw) if fw else None,
                "left_in_outbox": sum(f["outbox_batches"] for f in fw),
                "rejected": sum(f["rows_rejected"] for f in fw),
            },
            "engine_series": {
                "rows": int(series[0]),
                "steps_counted": int(series[1]),
                "bytes_per_row": round(int(sizes.get("engine_series", 0)) / max(int(series[0]), 1)),
            },
            "table_bytes": {k: int(v) for k, v in sizes.items()},
            "partitions": partitions,
            "load_start": load0,
            "load_end": outage.loadavg(),
            "cores": os.cpu_count(),
        }
        print(json.dumps(figures, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        ok = figures["storm"]["nodes_with_snapshot"] == args.nodes and figures["storm"]["duplicate_snapshots"] == 0
        return 0 if ok else 1
    finally:
        stop.set()
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
