"""Postgres stopped, then hung, under load, with a fault during each outage: what the sidecar
loses (nothing, it should), what /healthz says and when, how the API answers meanwhile, where
the fault's snapshot ends and when it is committed, how long the backlog takes to drain.

    python scripts/outage.py                                   # 60 s stop and 60 s SIGSTOP
    python scripts/outage.py --outage 3 --engines 2 --running 8 --steps-per-second 50   # CI size
    python scripts/outage.py --json out.json

What runs, all real processes:
- a throwaway Postgres cluster of its own (``initdb`` into a temporary folder, ``pg_ctl`` on a
  free port; as ``postgres`` when run as root), never a shared server;
- the load: ``flightrec simulate`` (engines writing steps into rings, serving /metrics);
- the sidecar: ``flightrec serve`` on the config the load wrote, NVML off, the kernel log a
  file this script appends an Xid line to (naming one engine's API-server pid: a trigger).

The outages, one after the other, each ``--outage`` seconds, then ``--recover`` seconds of
load before the next: ``stop`` (``pg_ctl stop -m fast``, then start: connections refused) and
``hang`` (SIGSTOP of every process of the cluster, then SIGCONT: connections accepted by the
kernel, nothing answered). Half-way through each, the Xid line. Throughout, /healthz,
/api/v1/engines and /api/v1/snapshots are polled every 0.5 s with a 15 s client timeout.

Counted at the end: step rows sent by the load (its own count per engine) against distinct
step rows in the database, duplicates, snapshots of the faults, each with its last step
beside the engine's last step when the fault was written and when the database came back.
Exit status 0 when nothing was lost and every figure the CI test asserts holds, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parents[1]
PY = sys.executable
FIRST_PID = 41_000  # collector.sim.load.api_pid(i) = FIRST_PID + 100 * i


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- a Postgres cluster of our own ------------------------------------------------------------
def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


class Cluster:
    """A Postgres server in a temporary folder, on a free port, started and stopped by us."""

    def __init__(self, work: Path) -> None:
        initdb, self.pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if initdb is None or self.pg_ctl is None:
            raise RuntimeError("initdb/pg_ctl not found (PATH or /usr/lib/postgresql/*/bin)")
        self.dir = work / "pgdata"
        self.dir.mkdir()
        self.port = free_port()
        self.user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres user
            pw = pwd.getpwnam("postgres")
            os.chown(work, pw.pw_uid, pw.pw_gid)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.user = ["runuser", "-u", "postgres", "--"]
        self._run(initdb, "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync")
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off -c shared_buffers=32MB -c max_connections=60"
        self.opts = opts
        self.start()
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as c:
            c.execute("CREATE DATABASE flightrec")

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/flightrec"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.user, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def start(self) -> None:
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.dir), "-o", self.opts, "-l", str(self.dir / "server.log"), "-w", "-t", "60", "start")

    def stop(self) -> None:
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.dir), "-m", "fast", "-w", "-t", "60", "stop")

    def pids(self) -> list[int]:
        """The postmaster first, then its children (backends and helpers)."""
        master = int((self.dir / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in glob("/proc/[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == master:
                    children.append(int(Path(stat).parent.name))
        return [master, *children]

    def hang(self) -> list[int]:
        master = self.pids()[0]
        os.kill(master, signal.SIGSTOP)  # first: once stopped it forks no new backend
        stopped = [master]
        for _ in range(3):  # the children, listed after the stop (a backend forked just before it is one)
            for pid in self.pids()[1:]:
                if pid not in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            time.sleep(0.05)
        return stopped

    def resume(self, pids: list[int]) -> None:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url.replace("+psycopg", ""), autocommit=True, connect_timeout=5) as c:
            return list(c.execute(sql).fetchall())

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.resume(self.pids())
        with contextlib.suppress(Exception):
            self.stop()


# -- watching the sidecar from outside -------------------------------------------------------
@dataclass
class Probe:
    t: float
    route: str
    seconds: float
    status: int | None  # None: no answer within the client timeout
    database_up: bool | None = None
    database_error: str | None = None


class Watcher(threading.Thread):
    """Polls the sidecar's routes, each on its own thread (one slow answer delays no other)."""

    def __init__(self, base: str, timeout_s: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.timeout_s = timeout_s
        self.probes: list[Probe] = []
        self.done = threading.Event()

    def run(self) -> None:
        routes = ["/healthz", "/api/v1/engines", "/api/v1/snapshots?limit=5"]
        lock = threading.Lock()

        def probe(route: str) -> None:
            with httpx.Client(base_url=self.base, timeout=self.timeout_s) as client:
                while not self.done.is_set():
                    t0 = time.time()
                    p = Probe(t0, route, 0.0, None)
                    try:
                        r = client.get(route)
                        p.status = r.status_code
                        if route == "/healthz":
                            h = r.json()
                            p.database_up, p.database_error = h.get("database_up"), h.get("database_error")
                    except (httpx.HTTPError, ValueError):
                        pass
                    p.seconds = time.time() - t0
                    with lock:
                        self.probes.append(p)
                    self.done.wait(max(0.0, 0.5 - p.seconds))

        threads = [threading.Thread(target=probe, args=(r,), daemon=True) for r in routes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def get_json(base: str, route: str, timeout: float = 15.0) -> Any:
    return httpx.get(base + route, timeout=timeout).json()


def last_step(base: str, engine: str) -> int | None:
    """The engine's last step as the sidecar holds it (``/metrics``: memory only, never waits
    for the database)."""
    from prometheus_client.parser import text_string_to_metric_families

    with contextlib.suppress(httpx.HTTPError, ValueError):
        text = httpx.get(base + "/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            for sm in fam.samples:
                if sm.name == "flightrec_engine_last_step" and sm.labels.get("engine") == engine:
                    return int(sm.value)
    return None


def wait_until(pred: Any, timeout: float, every: float = 0.25) -> float | None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        with contextlib.suppress(Exception):
            if pred():
                return time.time() - t0
        time.sleep(every)
    return None


# -- one run -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="flightrec-outage-"))
    os.chmod(work, 0o755)
    rings = work / "rings"
    kinds = [k for k in args.kinds.split(",") if k]
    fig: dict[str, Any] = {
        "engines": args.engines,
        "running": args.running,
        "steps_per_second": args.steps_per_second,
        "outage_s": args.outage,
        "recover_s": args.recover,
        "load_start": loadavg(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    cluster: Cluster | None = None
    sim = side = None
    logs = []
    try:
        cluster = Cluster(work)
        sim_config, summary, kmsg = work / "sim.yaml", work / "summary.json", work / "kmsg.log"
        kmsg.write_text("")
        load_s = args.warmup + len(kinds) * (args.outage + args.recover) + 10  # + the sidecar's start
        env = {**os.environ, "PYTHONPATH": str(HERE), "PYTHONUNBUFFERED": "1"}
        sim_log, side_log = open(work / "simulate.log", "w"), open(work / "sidecar.log", "w")
        logs = [sim_log, side_log]
        sim = subprocess.Popen(
            [
                PY,
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
                str(load_s),
                "--recorder-dir",
                str(rings),
                "--write-config",
                str(sim_config),
                "--serve-metrics",
                "--start-delay",
                "6",
                "--linger",
                "--summary-json",
                str(summary),
                "--progress-every",
                "0",
            ],
            cwd=HERE,
            env=env,
            stdout=sim_log,
            stderr=subprocess.STDOUT,
        )
        if wait_until(sim_config.exists, 60) is None:
            raise RuntimeError(f"the load did not start: {work / 'simulate.log'}")
        doc = yaml.safe_load(sim_config.read_text())
        engines = [str(e["name"]) for e in doc.get("engines") or []] or [f"vllm-{FIRST_PID + 100 * i}" for i in range(args.engines)]
        port = free_port()
        doc.update(
            database=cluster.url,
            port=port,
            host="127.0.0.1",
            kmsg=str(kmsg),
            nvml="off",
            host_name="outage-node",
            incident_window_s=2.0,
            spool_dir=str(work / "spool"),
        )
        (work / "sidecar.yaml").write_text(yaml.safe_dump(doc))
        side = subprocess.Popen(
            [PY, "-m", "collector.cli", "serve", "--config", str(work / "sidecar.yaml")], cwd=HERE, env=env, stdout=side_log, stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{port}"
        if wait_until(lambda: get_json(base, "/healthz", 2)["database_up"] is True, 120) is None:
            raise RuntimeError(f"the sidecar did not start writing: {work / 'sidecar.log'}")
        t_load0 = time.time()
        watcher = Watcher(base)
        watcher.start()
        outages: list[dict[str, Any]] = []
        seq = 9000
        for k, kind in enumerate(kinds):
            t_out = t_load0 + args.warmup + k * (args.outage + args.recover)
            time.sleep(max(0.0, t_out - time.time()))
            o: dict[str, Any] = {"kind": kind, "t_out": time.time()}
            stopped: list[int] = []
            if kind == "stop":
                cluster.stop()
            else:
                stopped = cluster.hang()
            o["began"] = time.time()
            time.sleep(max(0.0, o["began"] + args.outage / 2 - time.time()))
            engine_i = k % len(engines)
            o["engine"] = engines[engine_i]
            o["step_at_fault"] = last_step(base, o["engine"])
            seq += 1
            line = (
                f"4,{seq},{int(time.monotonic() * 1e6)},c;NVRM: Xid (PCI:0000:{k + 16:02x}:00): 43, "
                f"pid={FIRST_PID + 100 * engine_i}, name=python3, channel 0x0000000a"
            )
            o["t_fault"] = time.time()
            with open(kmsg, "a") as f:
                f.write(line + "\n")
            time.sleep(max(0.0, o["began"] + args.outage - time.time()))
            if kind == "stop":
                cluster.start()
            else:
                cluster.resume(stopped)
            o["t_back"] = time.time()
            o["step_at_return"] = last_step(base, o["engine"])

            def committed(o: dict[str, Any] = o) -> bool:
                rows = cluster.query(
                    f"SELECT id, last_step, fault_ts FROM snapshots WHERE engine = '{o['engine']}' "
                    f"AND trigger_kind = 'xid' AND fault_ts >= {o['t_fault'] - 5} ORDER BY id"
                )
                if rows:
                    o["snapshot_id"], o["snapshot_last_step"], o["snapshot_fault_ts"] = rows[0][0], rows[0][1], float(rows[0][2])
                    return True
                return False

            o["snapshot_committed_after_return_s"] = wait_until(committed, 120)

            def drained() -> bool:
                h = get_json(base, "/healthz", 5)
                held = h["ingest"]["rows_pending"]  # under load a few rounds' rows are always queued
                return bool(h["database_up"] and h["snapshots_waiting"] == 0 and held < 5 * args.engines * args.steps_per_second)

            o["drained_after_return_s"] = wait_until(drained, 120)
            outages.append(o)
        # the load ends by itself; the sidecar catches up
        wait_until(summary.exists, load_s + 120)
        load = json.loads(summary.read_text()) if summary.exists() else {}
        sent = {str(k): int(v) for k, v in (load.get("per_engine_steps") or {}).items()}
        fig["steps_sent"] = sum(sent.values()) if sent else None

        def caught_up() -> bool:
            h = get_json(base, "/healthz", 5)
            return bool(h["ingest"]["steps_written"] >= sum(sent.values()) and h["ingest"]["rows_pending"] == 0)

        fig["caught_up_after_load_end_s"] = wait_until(caught_up, 120)
        watcher.done.set()
        watcher.join(30)
        final_health = get_json(base, "/healthz", 15)
        fig["tasks"] = {t["name"]: t["restarts"] for t in final_health.get("tasks", [])}
        side.send_signal(signal.SIGINT)  # a graceful stop: what it holds is flushed
        fig["sidecar_exit"] = side.wait(60)
        from collector.storage.steps import count_stored_steps  # noqa: PLC0415 - the chunks are decoded to count

        rows = [(name, *count_stored_steps(cluster.url, engine=name)) for name in sent]
        stored = {str(name): int(distinct) for name, _, distinct in rows}
        fig["steps_stored"] = sum(stored.values())
        fig["duplicate_step_rows"] = sum(int(n) - int(d) for _, n, d in rows)
        fig["steps_lost"] = sum(max(0, n - stored.get(name, 0)) for name, n in sent.items()) if sent else None
        fig["snapshots_stored"] = int(cluster.query("SELECT count(*) FROM snapshots")[0][0])
        fig["outages"] = [summarise(o, watcher.probes, args) for o in outages]
        fig["load_end"] = loadavg()
    finally:
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
        for f in logs:
            f.close()
        if cluster is not None:
            cluster.destroy()
        if args.keep:
            fig["workdir"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return fig


def summarise(o: dict[str, Any], probes: list[Probe], args: argparse.Namespace) -> dict[str, Any]:
    during = [p for p in probes if p.t < o["t_back"] and p.t + p.seconds > o["began"]]  # asked or waiting during it
    # asked after the outage began and answered before it ended (one answered after the return may
    # rightly say the database is up)
    health = [p for p in during if p.route == "/healthz" and p.t >= o["began"] and p.t + p.seconds < o["t_back"]]
    down = next((p for p in health if p.database_up is False), None)
    by_route: dict[str, dict[str, Any]] = {}
    for route in sorted({p.route for p in during}):
        ps = [p for p in during if p.route == route]
        codes: dict[str, int] = {}
        for p in ps:
            codes[str(p.status)] = codes.get(str(p.status), 0) + 1
        by_route[route.split("?")[0]] = {"requests": len(ps), "max_s": round(max(p.seconds for p in ps), 2), "codes": codes}
    last_fault = o.get("snapshot_last_step")
    return {
        "kind": o["kind"],
        "engine": o["engine"],
        "healthz_said_down_after_s": None if down is None else round(down.t + down.seconds - o["began"], 1),
        "healthz_error": None if down is None else down.database_error,
        "healthz_ok_during": sum(1 for p in health if p.database_up is True and p.t - o["began"] > args.truth_within),
        "healthz_ok_at_s": [round(p.t - o["began"], 1) for p in health if p.database_up is True and p.t - o["began"] > args.truth_within],
        "api": by_route,
        "step_at_fault": o["step_at_fault"],
        "snapshot_last_step": last_fault,
        "step_at_return": o["step_at_return"],
        "snapshot_fault_ts_minus_write_s": None if "snapshot_fault_ts" not in o else round(o["snapshot_fault_ts"] - o["t_fault"], 2),
        "snapshot_committed_after_return_s": None
        if o["snapshot_committed_after_return_s"] is None
        else round(o["snapshot_committed_after_return_s"], 1),
        "drained_after_return_s": None if o["drained_after_return_s"] is None else round(o["drained_after_return_s"], 1),
    }


def verdict(fig: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What must hold; empty when it all does."""
    bad = []
    if fig.get("steps_lost") != 0:
        bad.append(f"steps lost: {fig.get('steps_lost')}")
    if fig.get("duplicate_step_rows"):
        bad.append(f"duplicate step rows: {fig['duplicate_step_rows']}")
    if fig.get("sidecar_exit") != 0:
        bad.append(f"sidecar exit {fig.get('sidecar_exit')}")
    for o in fig.get("outages", []):
        name = o["kind"]
        if o["healthz_said_down_after_s"] is None or o["healthz_said_down_after_s"] > args.truth_within:
            bad.append(f"{name}: /healthz said the database was down after {o['healthz_said_down_after_s']} s")
        if o["healthz_ok_during"]:
            bad.append(f"{name}: /healthz said the database was up {o['healthz_ok_during']} times during the outage")
        for route, r in o["api"].items():
            if "None" in r["codes"] or r["max_s"] > args.api_within:
                bad.append(f"{name}: {route} unanswered or slow (max {r['max_s']} s, codes {r['codes']})")
        if o["snapshot_committed_after_return_s"] is None:
            bad.append(f"{name}: the fault's snapshot was not committed")
        elif o["step_at_fault"] is not None and o["step_at_return"] is not None and o["snapshot_last_step"] is not None:
            # its rings end at the fault, well before the return
            # (the kernel-log poll and the capture take a moment: up to 3 s of steps)
            if not (o["step_at_fault"] <= o["snapshot_last_step"] <= o["step_at_fault"] + 3 * args.steps_per_second):
                bad.append(f"{name}: the snapshot ends at step {o['snapshot_last_step']}, the fault was at {o['step_at_fault']}")
        if o["drained_after_return_s"] is None:
            bad.append(f"{name}: the backlog did not drain")
    return bad


def print_table(fig: dict[str, Any]) -> None:
    print(
        f"load: {fig['engines']} engines x {fig['running']} running x {fig['steps_per_second']:g} steps/s; "
        f"outages of {fig['outage_s']:g} s, {fig['recover_s']:g} s apart; started {fig['started_utc']} UTC; "
        f"load average {fig['load_start']} at the start, {fig.get('load_end')} at the end"
    )
    print(
        f"steps sent {fig.get('steps_sent')}, stored {fig.get('steps_stored')}, lost {fig.get('steps_lost')}, "
        f"duplicate rows {fig.get('duplicate_step_rows')}; snapshots stored {fig.get('snapshots_stored')}; "
        f"caught up {fig.get('caught_up_after_load_end_s')} s after the load ended; task restarts {fig.get('tasks')}; "
        f"sidecar exit {fig.get('sidecar_exit')}"
    )
    head = (
        "outage",
        "/healthz down after s",
        "its error",
        "max s /healthz",
        "max s engines",
        "max s snapshots (codes)",
        "step at fault",
        "snapshot last step",
        "step at return",
        "committed after return s",
        "drained after s",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for o in fig.get("outages", []):
        api = o["api"]

        def mx(route: str, api: dict[str, Any] = api) -> str:
            return str(api.get(route, {}).get("max_s"))

        snaps = api.get("/api/v1/snapshots", {})
        err = (o["healthz_error"] or "")[:60].replace("|", "/")
        print(
            f"| {o['kind']} | {o['healthz_said_down_after_s']} | {err} | {mx('/healthz')} | {mx('/api/v1/engines')} | "
            f"{snaps.get('max_s')} ({snaps.get('codes')}) | {o['step_at_fault']} | {o['snapshot_last_step']} | {o['step_at_return']} | "
            f"{o['snapshot_committed_after_return_s']} | {o['drained_after_return_s']} |"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--running", type=int, default=64)
    p.add_argument("--steps-per-second", type=float, default=100.0)
    p.add_argument("--outage", type=float, default=60.0, help="seconds each outage lasts")
    p.add_argument("--recover", type=float, default=30.0, help="seconds of load after each outage, before the next")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--kinds", default="stop,hang", help="outages in order: stop (pg_ctl stop), hang (SIGSTOP)")
    p.add_argument("--truth-within", type=float, default=10.0, help="/healthz must say down within this many seconds")
    p.add_argument("--api-within", type=float, default=15.0, help="every API answer within this many seconds")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    fig = run(args)
    print_table(fig)
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1, default=str))
    bad = verdict(fig, args)
    for line in bad:
        print("FAILED:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
