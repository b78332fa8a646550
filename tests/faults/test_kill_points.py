"""The sidecar SIGKILLed at every point of a snapshot, then started again: nothing lost, nothing
twice.

A real ``flightrec serve`` (through ``kill_at.py``, which patches the point from outside the
product) watches one engine whose steps are in a real ring file written with the channel's own
writer, and follows a kernel-log file. The test appends an Xid line to that file and asks for a
manual snapshot over HTTP; the wrapper SIGKILLs the process when the chosen trigger's snapshot
reaches the point. The sidecar is then started again, normally, and the database must hold
each trigger's snapshot once, with the trigger's own time, its event row once, and no step twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from collector.channel.codec import encode, encode_step_fields
from collector.channel.naming import ring_file_name
from collector.channel.ringfile import RingWriter
from collector.snapshot import intent, spool
from collector.storage.db import make_engine
from collector.storage.repo import Repository

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = Path(__file__).with_name("kill_at.py")
TOKEN = "kill-points-token"
SETTLE_S = 0.5
XID_LINE = "4,{seq},{us},c;NVRM: Xid (PCI:0000:18:00): 43, pid=3107, name=python3, channel 0x0000000a"
TALLY: list[str] = []


@dataclass
class Node:
    """One sidecar's files: its config, database, kernel log, ring and spool."""

    dir: Path
    db: str
    kmsg: Path
    spool: Path
    config: Path
    ring: RingWriter
    step: int = 0
    log: list[Path] = field(default_factory=list)

    def write_steps(self, n: int, start_ts: float, every: float = 0.01) -> None:
        for i in range(n):
            self.step += 1
            self.ring.append(encode_step_fields(self.step, start_ts + i * every, 0, 4, 1, 0, 0.25, 0, 10, 4, 0, 0, 0))

    def start(self, point: str | None = None, trigger: str = "xid") -> tuple[subprocess.Popen[bytes], str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("FLIGHTREC_KILL_AT", None)
        if point is not None:
            env.update(FLIGHTREC_KILL_AT=point, FLIGHTREC_KILL_TRIGGER=trigger)
        out = self.dir / f"sidecar-{len(self.log)}.log"
        self.log.append(out)
        cmd = [sys.executable, str(WRAPPER)] if point is not None else [sys.executable, "-m", "collector.cli"]
        with open(out, "wb") as f:
            proc = subprocess.Popen([*cmd, "serve", "--config", str(self.config), "--port", "0"], cwd=self.dir, env=env,
                                    stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.time() + 60
        while time.time() < deadline:
            text_ = out.read_text(errors="replace")
            if "serving on http://" in text_:
                return proc, text_.split("serving on ", 1)[1].split()[0]
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        raise AssertionError("the sidecar did not start:\n" + out.read_text(errors="replace"))

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.log)


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    db = request.getfixturevalue("pg_url") if "postgres" in request.node.name else f"sqlite:///{tmp_path / 'f.db'}"
    rec, kmsg, spool_dir = tmp_path / "rec", tmp_path / "kmsg.log", tmp_path / "spool"
    rec.mkdir(mode=0o700)
    kmsg.write_text("")
    cfg = tmp_path / "flightrec.yaml"
    cfg.write_text(
        f"database: {db}\nnvml: off\nkmsg: {kmsg}\nkmsg_poll_interval: 0.05\nrecorder_dir: {rec}\nspool_dir: {spool_dir}\n"
        f"host_name: node-k\napi_token: {TOKEN}\nsnapshot_settle_s: {SETTLE_S}\nincident_window_s: 5\n"
        "engines:\n  - name: decode-0\n    url: http://127.0.0.1:9\n"
    )  # fmt: skip
    # the engine: this test process, writing its ring the way the in-engine recorder does
    ring = RingWriter(rec / ring_file_name("decode-0", "stats", os.getpid()), capacity=1 << 20)
    ring.append(encode({"t": "meta", "engine": "decode-0", "engine_index": 0, "role": "stats", "pid": os.getpid()}))
    n = Node(tmp_path, db, kmsg, spool_dir, cfg, ring)
    n.write_steps(300, time.time() - 10.0)
    yield n
    ring.close()


def _wait(what: str, cond: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _steps_in(base: str) -> int:
    try:
        engines = httpx.get(base + "/api/v1/engines", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    except httpx.HTTPError:
        return 0
    return int(engines[0]["steps_in_ring"] or 0) if engines else 0


def _query(db: str, sql: str) -> list[Any]:
    eng = make_engine(db)
    try:
        with eng.connect() as conn:
            return list(conn.execute(text(sql)))
    finally:
        eng.dispose()


def _xid_accepted(n: Node) -> bool:
    if intent.pending(n.spool):
        return True
    try:
        return bool(_query(n.db, "SELECT 1 FROM snapshots WHERE trigger_kind = 'xid'"))
    except Exception:
        return False


# every point for the kernel's trigger; the manual one (the same path after its intent) and
# Postgres at the points where the database's part differs; about 8 s a case
CASES = [(p, "xid", "sqlite") for p in ("before_spool", "spool_tmp", "after_spool", "in_commit_tx", "after_commit", "in_amend")]
CASES += [(p, "manual", "sqlite") for p in ("before_spool", "in_commit_tx", "after_commit", "in_amend")]
CASES += [(p, "xid", "postgres") for p in ("spool_tmp", "in_commit_tx", "after_commit")]
PARAMS = [pytest.param(p, t, d, id=f"{p}-{t}-{d}", marks=[pytest.mark.slow] + ([pytest.mark.postgres] if d == "postgres" else []))
          for p, t, d in CASES]  # fmt: skip


@pytest.mark.parametrize(("point", "trigger", "db"), PARAMS)
def test_a_kill_at_each_point_of_a_snapshot_loses_nothing_and_stores_nothing_twice(node: Node, point: str, trigger: str,
                                                                                    db: str) -> None:  # fmt: skip
    proc, base = node.start(point, trigger)
    sent: dict[str, float] = {}  # trigger kind -> when it was given to the sidecar
    acked: set[str] = set()
    try:
        assert _wait("the ring read", lambda: _steps_in(base) >= 300, 30)
        sent["xid"] = time.time()
        with open(node.kmsg, "a") as f:
            f.write(XID_LINE.format(seq=101, us=int(time.monotonic() * 1e6)) + "\n")
        _wait("the Xid accepted", lambda: _xid_accepted(node), 30, proc)
        if proc.poll() is None:
            sent["manual"] = time.time()
            try:
                r = httpx.post(base + "/api/v1/snapshots", json={"engine": "decode-0", "reason": "kill drill"},
                               headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20)  # fmt: skip
                if r.status_code in (201, 202):
                    acked.add("manual")
            except httpx.HTTPError:
                pass  # killed while the request waited for its commit
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the kill point was never reached:\n{node.output()}"
    assert f"SIGKILL at {point}" in node.output()
    if point == "spool_tmp":  # the kill left a whole temporary file and no spool file
        assert list(node.spool.glob(".snapshot-*.tmp")) and not spool.pending(node.spool)
    # the engine goes on after the fault: steps a retake must not put in the fault's snapshot
    restarted_at = time.time()
    node.write_steps(100, restarted_at)

    proc, base = node.start()
    must = {trigger} | acked | {"xid"}
    try:
        def settled() -> bool:
            kinds = {r[0] for r in _query(node.db, "SELECT trigger_kind FROM snapshots")}
            return must <= kinds and not intent.pending(node.spool) and not spool.pending(node.spool)

        _wait("every trigger's snapshot", settled, 60, proc)
        time.sleep(SETTLE_S + 0.3)  # a retaken snapshot is never amended; let anything wrong show
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, node.output()

    snaps = _query(node.db, "SELECT id, trigger_kind, trigger_uid, fault_ts, summary FROM snapshots ORDER BY id")
    events = _query(node.db, "SELECT uid, kind, ts, snapshot_id FROM events WHERE kind IN ('xid', 'manual')")
    steps = _query(node.db, "SELECT count(*), count(DISTINCT engine_id * 10000000000 + run * 100000 + step) FROM engine_steps")
    by_kind: dict[str, list[Any]] = {}
    for s in snaps:
        by_kind.setdefault(s.trigger_kind, []).append(s)
    stored = {k for k in sent if len(by_kind.get(k, [])) == 1}
    lost = sorted(must - set(by_kind))
    retaken = sorted(s.trigger_kind for s in snaps if _summary(s.summary).get("retaken"))
    unanswered = sorted(k for k in sent if k not in must and k not in stored)  # sent as the process died
    line = (f"{point:>12} {trigger:>6} {db:>8}: triggers sent {len(sent)}, accepted {len(must)}, stored {len(stored)}, "
            f"lost {len(lost)}, retaken {retaken or 'none'}, not answered and not stored {unanswered or 'none'}; "
            f"snapshots {len(snaps)}, step rows {steps[0][0]} (distinct {steps[0][1]})")  # fmt: skip
    print(line)
    TALLY.append(line)
    assert not lost, node.output()
    for kind, rows in by_kind.items():
        assert len(rows) == 1, f"{kind}: {len(rows)} snapshots of one trigger"
        snap = rows[0]
        ev = [e for e in events if e.uid == snap.trigger_uid]
        assert len(ev) == 1, f"{kind}: event rows {ev}"  # its event row, once
        assert ev[0].snapshot_id == snap.id and ev[0].kind == kind
        assert snap.fault_ts == pytest.approx(ev[0].ts) and snap.fault_ts < restarted_at  # the fault's own time
        assert kind in sent and sent[kind] - 5 < snap.fault_ts < sent[kind] + 5
        doc = Repository(make_engine(node.db), host="node-k").get_snapshot(snap.id)
        assert doc.steps and doc.steps[-1]["ts"] <= snap.fault_ts + SETTLE_S  # the rings at the fault, not at the restart
        assert doc.steps[-1]["step"] >= 300
    assert steps[0][0] == steps[0][1] >= 400  # every step once
    if point == "in_amend":
        assert _summary(by_kind[trigger][0].summary).get("amended_at")  # the spooled amendment committed at restart
    assert not list(node.spool.glob("*.bad"))


def _summary(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        import json

        return dict(json.loads(value))
    return dict(value or {})
