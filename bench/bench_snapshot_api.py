"""The snapshot API under load, through the real HTTP server (uvicorn on loopback, another process).

1. Store ``--big`` snapshots of ``--steps`` steps x ``--requests`` requests through the real
   Repository (timed), then ``--clients`` concurrent clients fetch them (``GET
   /api/v1/snapshots/{id}``, gzip accepted, time to the last byte of the body), p50/p99.
2. With ``--list-rows`` snapshots stored, the same clients list (``GET /api/v1/snapshots``,
   50 per page, first page and a filtered page), p50/p99.

    python bench/bench_snapshot_api.py --db sqlite:///tmp/bench.db
    python bench/bench_snapshot_api.py --db postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.request_columns: rows as the recorder writes them

from collector.model import Event, EventKind, GpuSample, Severity, StepRecord  # noqa: E402
from collector.snapshot.freeze import build_snapshot  # noqa: E402
from collector.storage.connect import make_engine  # noqa: E402
from collector.storage.migrate import upgrade  # noqa: E402
from collector.storage.models import IncidentRow, SnapshotRow  # noqa: E402
from collector.storage.repo import Repository  # noqa: E402
from tests.request_columns import Row, with_rows  # noqa: E402

PORT_RANGE = range(18570, 18599)


def big_doc(engine: str, steps: int, requests: int, ts: float) -> Any:
    recs = [
        with_rows(
            StepRecord(
                engine=engine,
                ts=ts - (steps - i) * 0.025,
                step=100_000 + i,
                running=requests,
                waiting=2,
                kv_cache_usage=0.032,
                generation_tokens=requests,
            ),
            [Row(f"cmpl-c16-{j:04d}-0", 32000, 32000 + i, i, mirror_rows=400 + i // 64) for j in range(requests)],
        )
        for i in range(steps)
    ]
    trig = Event(kind=EventKind.XID, ts=ts, source="kmsg", message="NVRM: Xid (PCI:0000:00:06): 43", xid=43, severity=Severity.CRITICAL)
    gpu = [GpuSample(gpu="GPU-1", index=1, ts=ts - 300 + k, utilization=90.0, temperature=60.0, power_w=500.0) for k in range(300)]
    return build_snapshot(
        host="bench-host",
        engine=engine,
        trigger=trig,
        steps=recs,
        gpu_samples=gpu,
        events=[trig],
        log_lines=[],
        fingerprint={"block_size": 64},
        created_at=ts,
    )


def free_port() -> int:
    for port in PORT_RANGE:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18570-18598")


def serve(db: str, port: int) -> None:
    """The server process: the app over the database, as the sidecar serves it."""
    import uvicorn

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "api"))
    from api_context import make_context

    from collector.api.app import create_app

    uvicorn.run(create_app(make_context(db, host_name="bench-host")), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def hammer(base: str, paths: list[str], clients: int, rounds: int) -> tuple[list[float], int]:
    lat: list[float] = []
    sizes: list[int] = []
    lock = threading.Lock()
    errors: list[str] = []

    def client(k: int) -> None:
        with httpx.Client(base_url=base, timeout=60, headers={"Accept-Encoding": "gzip"}) as c:
            for r in range(rounds):
                path = paths[(k + r) % len(paths)]
                t0 = time.perf_counter()
                with c.stream("GET", path) as resp:
                    n = sum(len(chunk) for chunk in resp.iter_raw())  # the bytes as sent (gzip)
                dt = time.perf_counter() - t0
                with lock:
                    if resp.status_code != 200:
                        errors.append(f"{path}: {resp.status_code}")
                    lat.append(dt)
                    sizes.append(n)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"errors: {errors[:5]}")
    return lat, int(statistics.median(sizes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite:///" + str(Path(tempfile.mkdtemp(prefix="flightrec-bench-api-")) / "b.db"))
    p.add_argument("--big", type=int, default=3)
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10, help="fetches per client")
    p.add_argument("--list-rows", type=int, default=10_000)
    p.add_argument("--serve", nargs=2, metavar=("DB", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return

    upgrade(args.db)
    repo = Repository(make_engine(args.db), host="bench-host")
    t = time.time()
    ids, store_s = [], []
    for k in range(args.big):
        doc = big_doc("decode-0", args.steps, args.requests, t - 3600 * (k + 1))
        t0 = time.perf_counter()
        ids.append(repo.store_snapshot(doc, incident_window_s=30, incident_key="bench")[0])
        store_s.append(time.perf_counter() - t0)

    # the list: copy the big snapshots' summary rows (the list reads the snapshots table only)
    with repo.db.begin() as conn:
        proto = dict(conn.execute(select(SnapshotRow).where(SnapshotRow.id == ids[0])).mappings().one())
        inc = conn.execute(
            insert(IncidentRow)
            .values(key="bench", title="bench", opened_at=t, updated_at=t, trigger_kind="xid", hosts=["bench-host"], engines=[], snapshot_count=0)
            .returning(IncidentRow.id)
        ).scalar_one()
        have = conn.execute(select(SnapshotRow.id)).all()
        rows = []
        for n in range(max(0, args.list_rows - len(have))):
            r = {k: v for k, v in proto.items() if k != "id"}
            r.update(created_at=t - n * 7.0, fault_ts=t - n * 7.0, engine=f"decode-{n % 16}", host=f"node-{n % 8}", incident_id=inc)
            rows.append(r)
        for i in range(0, len(rows), 2000):
            conn.execute(insert(SnapshotRow), rows[i : i + 2000])

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", args.db, str(port)], env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.1)
        hammer(base, [f"/api/v1/snapshots/{i}" for i in ids], 2, 1)  # warm up
        backend = args.db.split(":", 1)[0].split("+")[0]
        print(f"backend {backend}; {args.clients} concurrent clients; command: {' '.join(sys.argv)}")
        print(f"  store {args.steps}x{args.requests} snapshot through the Repository: median {statistics.median(store_s) * 1e3:.0f} ms")
        lat, size = hammer(base, [f"/api/v1/snapshots/{i}" for i in ids], args.clients, args.rounds)
        print(
            f"  GET /snapshots/{{id}} ({args.steps} steps x {args.requests} requests, {size / 1e3:.0f} kB gzip): "
            f"p50 {pct(lat, 50) * 1e3:.1f} ms  p99 {pct(lat, 99) * 1e3:.1f} ms  (n={len(lat)})"
        )
        if shutil.which("wrk"):
            # The Python clients above share the 2 cores and a GIL with each other; wrk (C) is a
            # load generator that costs the server's cores almost nothing.
            out = subprocess.run(
                ["wrk", "-t2", f"-c{args.clients}", "-d10s", "--latency", "-H", "Accept-Encoding: gzip", f"{base}/api/v1/snapshots/{ids[0]}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            dist = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)$", out, re.M))
            rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
            print(
                f"  GET /snapshots/{{id}} with wrk, {args.clients} connections, 10 s: p50 {dist.get('50')}  p99 {dist.get('99')}  "
                f"({rps.group(1) if rps else '?'} requests/s)"
            )
        lat, size = hammer(
            base,
            ["/api/v1/snapshots?limit=50", "/api/v1/snapshots?limit=50&engine=decode-3", "/api/v1/snapshots?limit=50&host=node-2&trigger=xid"],
            args.clients,
            args.rounds * 3,
        )
        print(
            f"  GET /snapshots (list, {args.list_rows} stored, 50 per page): p50 {pct(lat, 50) * 1e3:.1f} ms  "
            f"p99 {pct(lat, 99) * 1e3:.1f} ms  (n={len(lat)})"
        )
        lat, _ = hammer(base, ["/api/v1/snapshots?limit=50"], 1, 50)
        print(f"  GET /snapshots (list, one client): p50 {pct(lat, 50) * 1e3:.1f} ms  p99 {pct(lat, 99) * 1e3:.1f} ms")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
