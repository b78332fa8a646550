"""A real ``flightrec serve`` and its files for the fault suites: its config, SQLite or Postgres
database, kernel-log file, spool folder, and one engine's ring written with the channel's own
writer (the engine is the test process: alive, and writing more when a test says so)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from collector.channel.codec import encode, encode_step_fields
from collector.channel.naming import ring_file_name
from collector.channel.ringfile import RingWriter
from collector.snapshot import intent
from collector.storage.connect import make_engine

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = Path(__file__).with_name("kill_at.py")
TOKEN = "kill-points-token"
SETTLE_S = 0.5
XID_LINE = "4,{seq},{us},c;NVRM: Xid (PCI:0000:18:00): 43, pid=3107, name=python3, channel 0x0000000a"


@dataclass
class Node:
    """One sidecar's files: its config, database, kernel log, ring and spool."""

    dir: Path
    db: str
    kmsg: Path
    spool: Path
    config: Path
    ring: RingWriter | None  # None: the engine is dead, its ring left behind
    step: int = 0
    log: list[Path] = field(default_factory=list)

    def write_steps(self, n: int, start_ts: float, every: float = 0.01) -> None:
        if self.ring is None:
            return  # a dead engine writes nothing more
        for i in range(n):
            self.step += 1
            self.ring.append(encode_step_fields(self.step, start_ts + i * every, 0, 4, 1, 0, 0.25, 0, 10, 4, 0, 0, 0))

    def start(self, point: str | None = None, trigger: str = "xid", *, wrapper: bool = False) -> tuple[subprocess.Popen[bytes], str]:
        """``flightrec serve``; through ``kill_at.py`` with a kill point (or ``wrapper``)."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("FLIGHTREC_KILL_AT", None)
        if point is not None:
            env.update(FLIGHTREC_KILL_AT=point, FLIGHTREC_KILL_TRIGGER=trigger)
        out = self.dir / f"sidecar-{len(self.log)}.log"
        self.log.append(out)
        cmd = [sys.executable, str(WRAPPER)] if point is not None or wrapper else [sys.executable, "-m", "collector.cli"]
        with open(out, "wb") as f:
            proc = subprocess.Popen(
                [*cmd, "serve", "--config", str(self.config), "--port", "0"], cwd=self.dir, env=env, stdout=f, stderr=subprocess.STDOUT
            )
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


DEAD_ENGINE = """
import sys, time
from pathlib import Path
from collector.channel.codec import encode, encode_step_fields
from collector.channel.naming import ring_file_name
from collector.channel.ringfile import RingWriter
import os
ring = RingWriter(Path(sys.argv[1]) / ring_file_name("decode-0", "stats", os.getpid()), capacity=1 << 20)
ring.append(encode({"t": "meta", "engine": "decode-0", "engine_index": 0, "role": "stats", "pid": os.getpid()}))
t0 = time.time() - 10.0
for i in range(300):
    ring.append(encode_step_fields(i + 1, t0 + i * 0.01, 0, 4, 1, 0, 0.25, 0, 10, 4, 0, 0, 0))
os._exit(0)  # dies as an engine does: no close, the ring stays
"""


def make_node(tmp_path: Path, db: str, *, dead_engine: bool = False) -> Node:
    rec, kmsg, spool_dir = tmp_path / "rec", tmp_path / "kmsg.log", tmp_path / "spool"
    rec.mkdir(mode=0o700)
    kmsg.write_text("")
    cfg = tmp_path / "flightrec.yaml"
    cfg.write_text(
        f"database: {db}\nnvml: off\nkmsg: {kmsg}\nkmsg_poll_interval: 0.05\nrecorder_dir: {rec}\nspool_dir: {spool_dir}\n"
        f"host_name: node-k\napi_token: {TOKEN}\nsnapshot_settle_s: {SETTLE_S}\nincident_window_s: 5\n"
        "engines:\n  - name: decode-0\n    url: http://127.0.0.1:9\n"
        # The engine is this test process: its steps hold 4 running requests and come only when
        # a test writes them, so between writes it is, by definition, wedged. These tests are
        # about the commit and stop paths; a wedge's own snapshot is tested in tests/snapshot.
        "detectors:\n  wedge:\n    enabled: false\n"
    )
    if dead_engine:  # a process that wrote 300 steps and died before the sidecar started
        subprocess.run([sys.executable, "-c", DEAD_ENGINE, str(rec)], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return Node(tmp_path, db, kmsg, spool_dir, cfg, None, step=300)
    # the engine: this test process, writing its ring the way the in-engine recorder does
    ring = RingWriter(rec / ring_file_name("decode-0", "stats", os.getpid()), capacity=1 << 20)
    ring.append(encode({"t": "meta", "engine": "decode-0", "engine_index": 0, "role": "stats", "pid": os.getpid()}))
    n = Node(tmp_path, db, kmsg, spool_dir, cfg, ring)
    n.write_steps(300, time.time() - 10.0)
    return n


def wait_for(what: str, cond: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def steps_in(base: str) -> int:
    try:
        engines = httpx.get(base + "/api/v1/engines", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()["items"]
    except httpx.HTTPError:
        return 0
    return int(engines[0]["steps_in_ring"] or 0) if engines else 0


def query(db: str, sql: str) -> list[Any]:
    eng = make_engine(db)
    try:
        with eng.connect() as conn:
            return list(conn.execute(text(sql)))
    finally:
        eng.dispose()


def xid_accepted(n: Node) -> bool:
    if intent.pending(n.spool):
        return True
    try:
        return bool(query(n.db, "SELECT 1 FROM snapshots WHERE trigger_kind = 'xid'"))
    except Exception:
        return False
