"""The kill points under node load: a real ``flightrec serve`` SIGKILLed at one point of a snapshot
while ``flightrec simulate`` writes N engines' rings (R running requests, S steps/s each) and
serves their ``/metrics``, which the sidecar scrapes; then started again, under the same load.
Shared by ``test_kill_points_under_load.py`` (scaled down, slow-marked) and
``scripts/kill_points_under_load.py`` (the full size, for RELIABILITY.md).

Each case writes F Xid lines at once to the followed kernel-log file, fault k naming engine k's
API-server pid on a bus of its own (so each is its own fault of one engine), and the kill comes
when the first Xid snapshot reaches the point. After the restart every fault must have exactly
one snapshot, of its engine, with its own time and the rings at that time (not at the restart),
and one event row linking it; no step row twice; nothing set aside or left over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from collector.snapshot import intent, spool
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from collector.storage.steps import count_stored_steps
from tests.faults import sidecar_node as sn

FIRST_PID = 41_000  # collector.sim.load.api_pid(i)
SETTLE_S = 0.5


@dataclass
class NodeLoad:
    """``flightrec simulate`` running: its engines' rings in ``recorder``, their /metrics served."""

    engines: int
    running: int
    steps_per_second: float
    work: Path
    proc: subprocess.Popen[bytes] | None = None
    doc: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        recorder = Path(tempfile.mkdtemp(prefix="flightrec-kill-load-", dir=shm))
        cfg = self.work / "sim.yaml"
        env = {**os.environ, "PYTHONPATH": str(sn.ROOT), "PYTHONUNBUFFERED": "1"}
        with open(self.work / "simulate.log", "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "collector.cli",
                    "simulate",
                    "--engines",
                    str(self.engines),
                    "--running",
                    str(self.running),
                    "--steps-per-second",
                    str(self.steps_per_second),
                    "--recorder-dir",
                    str(recorder),
                    "--write-config",
                    str(cfg),
                    "--serve-metrics",
                    "--progress-every",
                    "0",
                ],
                cwd=sn.ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.time() + 60
        while not (self.doc.get("engines") if isinstance(self.doc, dict) else None):
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError("the load did not start:\n" + (self.work / "simulate.log").read_text(errors="replace"))
            time.sleep(0.05)
            if cfg.exists():
                self.doc = yaml.safe_load(cfg.read_text()) or {}

    def engine(self, i: int) -> str:
        return str(self.doc["engines"][i]["name"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        recorder = self.doc.get("recorder_dir")
        if recorder:
            for p in Path(recorder).glob("*"):
                p.unlink(missing_ok=True)
            Path(recorder).rmdir()


def node_for(load: NodeLoad, work: Path) -> sn.Node:
    work.mkdir(parents=True, exist_ok=True)
    kmsg, spool_dir = work / "kmsg.log", work / "spool"
    kmsg.write_text("")
    db = f"sqlite:///{work / 'f.db'}"
    doc = dict(load.doc)
    doc.update(
        database=db,
        nvml="off",
        kmsg=str(kmsg),
        kmsg_poll_interval=0.05,
        spool_dir=str(spool_dir),
        host_name="node-k",
        api_token=sn.TOKEN,
        snapshot_settle_s=SETTLE_S,
        incident_window_s=5,
    )
    doc.pop("port", None)
    cfg = work / "flightrec.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    return sn.Node(work, db, kmsg, spool_dir, cfg, None)


def _engines_reading(base: str, names: list[str]) -> bool:
    try:
        rows = httpx.get(base + "/api/v1/engines", headers={"Authorization": f"Bearer {sn.TOKEN}"}, timeout=10).json()["items"]
    except (httpx.HTTPError, ValueError):
        return False
    got = {r["name"]: int(r.get("steps_in_ring") or 0) for r in rows}
    return all(got.get(n, 0) > 0 for n in names)


def _summary(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return dict(json.loads(value))
    return dict(value or {})


def run_case(load: NodeLoad, work: Path, point: str, faults: int) -> str:
    """One kill point under the load; asserts the guarantees, returns one line of figures."""
    node = node_for(load, work)
    names = [load.engine(k) for k in range(faults)]
    proc, base = node.start(point, "xid")
    sent: dict[str, float] = {}
    try:
        assert sn.wait_for("every engine's ring read", lambda: _engines_reading(base, names), 90, proc)
        lines = []
        for k, name in enumerate(names):
            lines.append(
                f"4,{9001 + k},{int(time.monotonic() * 1e6)},c;NVRM: Xid (PCI:0000:{k + 16:02x}:00): 43, "
                f"pid={FIRST_PID + 100 * k}, name=python3, channel 0x0000000a"
            )
            sent[name] = time.time()
        with open(node.kmsg, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the kill point was never reached:\n{node.output()}"
    assert f"SIGKILL at {point}" in node.output()
    restarted_at = time.time()
    t_restart = time.monotonic()
    proc, base = node.start()
    try:

        def settled() -> bool:
            engines = {r[0] for r in sn.query(node.db, "SELECT engine FROM snapshots WHERE trigger_kind = 'xid'")}
            return set(names) <= engines and not intent.pending(node.spool) and not spool.pending(node.spool)

        sn.wait_for("every fault's snapshot", settled, 120, proc)
        settled_s = time.monotonic() - t_restart
        time.sleep(SETTLE_S + 0.5)  # let anything wrong (a second snapshot, an amendment) show
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, node.output()

    snaps = sn.query(
        node.db,
        "SELECT id, engine, trigger_uid, fault_ts, summary FROM snapshots WHERE trigger_kind = 'xid' ORDER BY id",
    )
    events = sn.query(node.db, "SELECT uid, ts, snapshot_id, message FROM events WHERE kind = 'xid'")
    steps = [count_stored_steps(node.db)]
    repo = Repository(make_engine(node.db), host="node-k")
    by_engine: dict[str, list[Any]] = {}
    for s in snaps:
        by_engine.setdefault(s.engine, []).append(s)
    retaken = replayed = 0
    for name in names:
        rows = by_engine.get(name, [])
        assert len(rows) == 1, f"{name}: {len(rows)} snapshots of one fault\n{node.output()}"
        snap = rows[0]
        ev = [e for e in events if e.uid == snap.trigger_uid]
        assert len(ev) == 1 and ev[0].snapshot_id == snap.id, f"{name}: event rows {ev}"
        assert sent[name] - 5 < snap.fault_ts < sent[name] + 5 and snap.fault_ts < restarted_at  # the fault's own time
        doc = repo.get_snapshot(snap.id)
        summary = _summary(snap.summary)
        late = bool(summary.get("retaken") or summary.get("replayed"))
        retaken += bool(summary.get("retaken"))
        replayed += bool(summary.get("replayed"))
        assert doc.steps, f"{name}: no steps"
        # the rings at the fault, not at the restart: one taken again after the restart (retaken
        # from its intent, or its line read again) is cut at the fault + settle; one committed
        # before the kill holds only what the first run read
        last = doc.steps[-1]["ts"]
        why = f"{name}: last step at {last:.3f}, fault at {snap.fault_ts:.3f}, restart at {restarted_at:.3f}"
        assert last <= snap.fault_ts + SETTLE_S if late else last < restarted_at, why
    assert len(events) == faults, f"xid event rows {len(events)} for {faults} faults"
    assert len(snaps) == faults
    assert steps[0][0] == steps[0][1]  # no step row twice
    assert not list(node.spool.glob("*.bad")) and not list(node.spool.glob(".*.tmp"))
    return (
        f"{point:>12}: faults {faults}, snapshots {len(snaps)} (one each), retaken {retaken}, read again {replayed}, "
        f"event rows {len(events)}, step rows {steps[0][0]} (distinct {steps[0][1]}), all settled {settled_s:.1f} s after the restart"
    )
