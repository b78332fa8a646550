"""A fault storm into one shared Postgres: N nodes' snapshots, one fault per node within
``--storm-s`` seconds, each spooled and committed the way a sidecar's commit queue does it
(``SnapshotStore.commit``: the snapshot, its parts and its trigger's event row in one
transaction, filed under its incident), every node with its own connection pool.

What a node does before the commit (capture the ring, build the document, encode the parts:
bench_freeze.py, on the node's own CPU) is done once here and its parts reused by every node, so
that 64 nodes' encoding on a shared 2-core machine does not pose as the store's cost; the spool
(written and fsynced, as before every commit) and the commit are each node's own. The nodes
share ``--procs`` Python processes, each an event loop with a thread per node (a sidecar commits
from a thread of its own), as bench_fleet.py's sidecars share interpreters.

Measured, printed, and written with ``--json``:
- stored: snapshots in the store against the nodes, duplicates (one per host and trigger);
- fault to shared store: from each node's fault moment until its commit returned (p50, p99, max),
  failed attempts retried every 2 s as the commit queue does (counted, with their errors);
- incidents: every snapshot of the storm in one incident (its faults lie within the incident
  window of each other), its snapshot count and hosts;
- the store-wide incident lock: how long each commit waited for it and held it (taken at the end
  of the transaction, held until its commit), when the code under test has ``_file``;
- the store's cost per snapshot: its processes' CPU seconds and WAL bytes over the storm,
  divided by the snapshots (a cluster of the bench's own, fsync on, so they are this run's alone;
  with ``--db`` a given server's CPU is not read).

    PYTHONPATH=. .venv/bin/python bench/bench_storm_commit.py --nodes 64 --storm-s 10 --json storm.json
    PYTHONPATH=. .venv/bin/python bench/bench_storm_commit.py --nodes 64 --pgbouncer 16   # through PgBouncer, transaction mode
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: another tree's collector/ can be measured the same way
sys.path.append(str(ROOT / "scripts"))

HOST_PREFIX = "storm-node-"
WINDOW_S = 30.0  # the sidecar's default incident_window_s
RETRY_S = 2.0  # the commit queue's retry_every


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def template(steps: int, running: int) -> tuple[Any, dict[str, bytes], dict[str, Any]]:
    """A full ring frozen into a document and encoded once: (doc, parts, counts)."""
    from collector.ingest.hub import hub_for
    from collector.model import HALF_STATS, Event, EventKind, StepRecord
    from collector.settings import EngineConfig, Settings
    from collector.snapshot.freeze import capture
    from collector.storage.snapshots import pack_parts
    from tests.request_columns import Row, with_rows

    hub = hub_for(Settings(engines=[EngineConfig(name="decode-0", url="http://d")], ring_steps=steps, ring_request_bytes=8 << 20))
    t0 = time.time() - steps * 0.01
    for i in range(steps):  # what the recorder delivers: a stats half and a requests half per step
        ts = t0 + i * 0.01
        hub.emit(
            StepRecord(
                engine="decode-0",
                ts=ts,
                step=i,
                running=running,
                waiting=0,
                kv_cache_usage=0.4,
                preemptions=0,
                prompt_tokens=0,
                generation_tokens=running,
                halves=HALF_STATS,
            )
        )
        rows = [Row(f"cmpl-{j:04d}-{random.getrandbits(32):08x}", 2000, 2000 + i, i, 0, "running", 400 + j) for j in range(running)]
        hub.emit(with_rows(StepRecord(engine="decode-0", ts=ts, step=i), rows))
    trigger = Event(kind=EventKind.XID, ts=t0 + steps * 0.01, source="kmsg", message="NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    doc = capture(hub.view, "decode-0", trigger, gpu_seconds=300).build()
    return doc, pack_parts(doc), doc.counts()


def worker(spec: dict[str, Any]) -> int:
    """One process: its nodes on one event loop, a thread and a connection pool each."""
    from collector.model import Event, EventKind, Severity
    from collector.snapshot import spool
    from collector.snapshot.document import SnapshotDoc
    from collector.storage import snapshots as snapshots_mod
    from collector.storage.connect import StorageError, make_engine
    from collector.storage.repo import Repository
    from collector.storage.writer import event_row

    lock_s: dict[int, tuple[float, float, float]] = {}  # thread id: (wait, acquired at, filed at)
    original = getattr(snapshots_mod.SnapshotStore, "_file", None)
    if original is not None:  # the lock taken here first (the same transaction's lock again is immediate)

        def timed_file(self: Any, conn: Any, unfiled: Any, window: float) -> None:
            from sqlalchemy import text

            t0 = time.monotonic()
            if self.d.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": snapshots_mod.INCIDENT_LOCK})
            t1 = time.monotonic()
            original(self, conn, unfiled, window)
            lock_s[threading_ident()] = (t1 - t0, t1, time.monotonic())

        snapshots_mod.SnapshotStore._file = timed_file  # type: ignore[attr-defined]

    doc0, blobs, counts = template(spec["steps"], spec["running"])
    header = doc0.header()
    nodes = spec["nodes"]
    pool = ThreadPoolExecutor(len(nodes))
    repos = {n["host"]: Repository(make_engine(spec["url"], pool_size=1, max_overflow=1), host=n["host"]) for n in nodes}
    for r in repos.values():  # connected before the storm, as a running sidecar is
        r.snapshot_count()
    spool_root = Path(spec["spool"])

    def commit(node: dict[str, Any], fault_ts: float) -> dict[str, Any]:
        host = node["host"]
        message = str(doc0.trigger.get("message", ""))
        trig = Event(
            kind=EventKind.XID, ts=fault_ts, source="kmsg", message=message, severity=Severity.CRITICAL, xid=79, uid=f"{host}-xid-{fault_ts:.6f}"
        )
        doc = SnapshotDoc.from_export({**header, "host": host, "fault_ts": fault_ts, "created_at": fault_ts, "trigger": trig.to_dict()})
        folder = spool_root / host
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        spool.write(folder, f"{trig.uid}.snap", doc.header(), {"incident_key": f"{host}/decode-0"}, blobs)
        t1 = time.time()
        item = snapshots_mod.SnapshotCommit(doc, f"{host}/decode-0", blobs=blobs, counts=counts, trigger_uid=trig.uid, events=[event_row(trig)])
        attempts, errors = 0, []
        while True:  # as the commit queue does: a failed attempt is retried every RETRY_S, the snapshot spooled meanwhile
            attempts += 1
            try:
                [(sid, stored)] = repos[host].commit_snapshots([item], incident_window_s=WINDOW_S)
                break
            except StorageError as exc:
                if exc.permanent or attempts >= 30:
                    raise
                errors.append(str(exc).splitlines()[0][:200])
                time.sleep(RETRY_S)
        t2, t2m = time.time(), time.monotonic()
        wait, acquired, filed = lock_s.pop(threading_ident(), (None, None, None))
        return {
            "host": host,
            "snapshot_id": sid,
            "stored": stored,
            "attempts": attempts,
            "errors": errors,
            "fault_to_store_s": t2 - fault_ts,
            "spool_s": t1 - t0,
            "commit_s": t2 - t1,
            "lock_wait_s": wait,
            "lock_held_s": None if acquired is None else t2m - acquired,  # filing and the commit
            "lock_commit_s": None if filed is None else t2m - filed,  # of which the commit
        }

    async def node(n: dict[str, Any]) -> dict[str, Any]:
        fault_ts = spec["t0"] + n["offset"]
        await asyncio.sleep(max(0.0, fault_ts - time.time()))
        return await asyncio.get_running_loop().run_in_executor(pool, commit, n, time.time())

    async def all_nodes() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(node(n) for n in nodes)))

    late = time.time() > spec["t0"]  # ready after the storm began: its first faults fire late

    results = asyncio.run(all_nodes())
    for r in repos.values():
        r.db.dispose()
    size = sum(len(b) for b in blobs.values())
    print(json.dumps({"results": results, "late": len(nodes) if late else 0, "blob_bytes": size, "request_rows": counts.get("request_rows")}))
    return 0


def threading_ident() -> int:
    import threading

    return threading.get_ident()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--storm-s", type=float, default=10.0, help="the faults fall within this many seconds")
    p.add_argument("--procs", type=int, default=4, help="Python processes the nodes share")
    p.add_argument("--steps", type=int, default=2048, help="steps in each snapshot's ring")
    p.add_argument("--running", type=int, default=16, help="running requests per step (the request rows)")
    p.add_argument("--db", help="a Postgres server URL to make the bench's database on (default: a cluster of the bench's own, fsync on)")
    p.add_argument("--pgbouncer", type=int, default=0, metavar="N", help="through PgBouncer in transaction mode, N server connections")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start-s", type=float, default=20.0, help="seconds the workers have to start before the storm")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(json.loads(Path(args.worker).read_text()))

    import outage  # scripts/outage.py: a Postgres cluster of our own, the machine's load
    import psycopg
    from sqlalchemy.engine import make_url

    from collector.storage.migrate import upgrade

    load0 = outage.loadavg()
    work = Path(tempfile.mkdtemp(prefix="flightrec-storm-"))
    os.chmod(work, 0o755)
    cluster = None
    bouncer = None
    dbname = f"flightrec_storm_{os.getpid()}"
    try:
        if args.db:
            server = args.db
        else:
            (work / "pg").mkdir()
            cluster = outage.Cluster(work / "pg")
            cluster.stop()  # fsync on: a shared store's real disk cost; connections for every node
            cluster.opts = cluster.opts.replace("-c fsync=off", "-c fsync=on").replace("max_connections=60", f"max_connections={2 * args.nodes + 20}")
            cluster.start()
            server = cluster.url
        admin = make_url(server).set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as c:
            c.execute(f'CREATE DATABASE "{dbname}"')
        direct = make_url(server).set(database=dbname).render_as_string(hide_password=False)
        url = direct
        if args.pgbouncer:
            from tests.support.pgbouncer import LocalPgBouncer

            bouncer = LocalPgBouncer(direct, pool_size=args.pgbouncer, max_client_conn=4 * args.nodes).start()
            url = bouncer.url(direct)
        upgrade(url)

        rng = random.Random(args.seed)
        t0 = time.time() + args.start_s  # the workers start (imports, the template) before the first fault
        nodes = [{"host": f"{HOST_PREFIX}{i:03d}", "offset": rng.uniform(0, args.storm_s)} for i in range(args.nodes)]
        procs = []
        for k in range(args.procs):
            spec = {"url": url, "nodes": nodes[k :: args.procs], "t0": t0, "steps": args.steps, "running": args.running, "spool": str(work / "spool")}
            path = work / f"worker-{k}.json"
            path.write_text(json.dumps(spec))
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", str(path)],
                    stdout=subprocess.PIPE,
                    env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                )
            )
        pg_before = _pg(cluster, direct)
        outs = [proc.communicate(timeout=600)[0] for proc in procs]
        if any(proc.returncode for proc in procs):
            raise SystemExit(f"a worker failed: {[proc.returncode for proc in procs]}")
        pg_after = _pg(cluster, direct)
        load1 = outage.loadavg()
        parts = [json.loads(o.decode().strip().splitlines()[-1]) for o in outs]
        results = [r for part in parts for r in part["results"]]
        with psycopg.connect(make_url(direct).set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True) as c:
            stored_rows = c.execute("SELECT count(*), count(DISTINCT (host, trigger_uid)), count(DISTINCT host) FROM snapshots").fetchone()
            incidents = c.execute("SELECT id, snapshot_count, jsonb_array_length(hosts::jsonb) FROM incidents ORDER BY id").fetchall()
            unfiled = c.execute("SELECT count(*) FROM snapshots WHERE incident_id IS NULL").fetchone()[0]
        lat = [r["fault_to_store_s"] for r in results]
        waits = [r["lock_wait_s"] for r in results if r["lock_wait_s"] is not None]
        held = [r["lock_held_s"] for r in results if r["lock_held_s"] is not None]
        held_commit = [r["lock_commit_s"] for r in results if r["lock_commit_s"] is not None]
        n = len(results)
        figures: dict[str, Any] = {
            "nodes": args.nodes,
            "storm_s": args.storm_s,
            "procs": args.procs,
            "through": f"pgbouncer transaction mode, {args.pgbouncer} server connections" if args.pgbouncer else "direct",
            "snapshot": {"steps": args.steps, "request_rows": parts[0]["request_rows"], "stored_bytes": parts[0]["blob_bytes"]},
            "stored": {
                "snapshots": stored_rows[0],
                "distinct": stored_rows[1],
                "hosts": stored_rows[2],
                "duplicates": stored_rows[0] - stored_rows[1],
                "unfiled": unfiled,
            },
            "incidents": [{"id": i[0], "snapshots": i[1], "hosts": i[2]} for i in incidents],
            "fault_to_store_s": {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat)},
            "commit_s": {"p50": pct([r["commit_s"] for r in results], 50), "p99": pct([r["commit_s"] for r in results], 99)},
            "retried": {"commits": sum(1 for r in results if r["attempts"] > 1), "errors": sorted({e for r in results for e in r["errors"]})[:5]},
            "spool_s": {"p50": pct([r["spool_s"] for r in results], 50), "p99": pct([r["spool_s"] for r in results], 99)},
            "lock_wait_s": {"p50": pct(waits, 50), "p99": pct(waits, 99), "max": max(waits)} if waits else None,
            "lock_held_s": {
                "p50": pct(held, 50),
                "p99": pct(held, 99),
                "max": max(held),
                "sum": sum(held),
                "commit_p50": pct(held_commit, 50),
                "commit_p99": pct(held_commit, 99),
            }
            if held
            else None,
            "store": {
                "cpu_s": None if pg_before["cpu_s"] is None else pg_after["cpu_s"] - pg_before["cpu_s"],
                "cpu_s_per_snapshot": None if pg_before["cpu_s"] is None else (pg_after["cpu_s"] - pg_before["cpu_s"]) / max(1, n),
                "wal_bytes_per_snapshot": (pg_after["wal"] - pg_before["wal"]) / max(1, n),
            },
            "late_nodes": sum(part["late"] for part in parts),
            "load": {"before": load0, "after": load1, "cpus": os.cpu_count()},
        }
        ok = stored_rows[0] == args.nodes and stored_rows[1] == args.nodes and unfiled == 0 and len(incidents) == 1 and incidents[0][1] == args.nodes
        figures["ok"] = ok
        _print(figures)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        return 0 if ok else 1
    finally:
        if bouncer is not None:
            bouncer.stop()
        if cluster is not None:
            cluster.stop()
        elif args.db:
            admin = make_url(args.db).set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
            with psycopg.connect(admin, autocommit=True, connect_timeout=5) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)


def _pg(cluster: Any, url: str) -> dict[str, Any]:
    import psycopg
    from sqlalchemy.engine import make_url

    with psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True) as c:
        wal = float(c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()[0])
    return {"wal": wal, "cpu_s": cluster_cpu_s(cluster.pids()) if cluster is not None else None}


def cluster_cpu_s(pids: list[int]) -> float:
    """The cluster's CPU seconds so far: the postmaster's own and its reaped children's (the
    backends of connections already closed), and the living children's."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0
    for i, pid in enumerate(pids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if i == 0:
            total += int(fields[13]) + int(fields[14])  # cutime, cstime: every exited backend
    return total / tck


def _print(f: dict[str, Any]) -> None:
    ms = lambda x: "n/a" if x is None else f"{x * 1e3:.0f} ms"  # noqa: E731
    s = f["stored"]
    load, snap = f["load"], f["snapshot"]
    print(f"{f['nodes']} nodes, one fault each within {f['storm_s']:.0f} s, {f['through']}")
    print(f"  load {load['before']} -> {load['after']} on {load['cpus']} CPUs; nodes of workers ready late: {f['late_nodes']}")
    print(f"  snapshot: {snap['steps']} steps, {snap['request_rows']} request rows, {snap['stored_bytes'] / 1e6:.2f} MB stored")
    print(f"  stored {s['snapshots']} of {f['nodes']} ({s['duplicates']} twice, {s['unfiled']} unfiled); incidents: {f['incidents']}")
    lat = f["fault_to_store_s"]
    print(f"  fault to shared store: p50 {ms(lat['p50'])}, p99 {ms(lat['p99'])}, max {ms(lat['max'])}")
    print(
        f"  commit p50 {ms(f['commit_s']['p50'])} p99 {ms(f['commit_s']['p99'])}; spool p50 {ms(f['spool_s']['p50'])} p99 {ms(f['spool_s']['p99'])}"
    )
    if f["retried"]["commits"]:
        print(f"  commits retried: {f['retried']['commits']} ({'; '.join(f['retried']['errors'])})")
    if f["lock_held_s"]:
        print(
            f"  incident lock: wait p50 {ms(f['lock_wait_s']['p50'])} p99 {ms(f['lock_wait_s']['p99'])}; "
            f"held p50 {ms(f['lock_held_s']['p50'])} p99 {ms(f['lock_held_s']['p99'])}, {f['lock_held_s']['sum']:.2f} s in all "
            f"(of which the commit p50 {ms(f['lock_held_s']['commit_p50'])} p99 {ms(f['lock_held_s']['commit_p99'])})"
        )
    else:
        print("  incident lock: not measured (the code under test has no separate filing)")
    st = f["store"]
    cpu = "n/a (a server not the bench's own)" if st["cpu_s_per_snapshot"] is None else f"{st['cpu_s_per_snapshot'] * 1e3:.0f} CPU-ms"
    print(f"  the store per snapshot: {cpu}, {st['wal_bytes_per_snapshot'] / 1e6:.2f} MB of WAL")
    print("  OK" if f["ok"] else "  NOT OK")


if __name__ == "__main__":
    sys.exit(main())
