"""A restarted engine is followed, tried as a new user would: ``flightrec simulate`` (one engine,
100 steps/s, serving /metrics on its port) watched by ``flightrec serve``, SIGKILLed after some
thousand steps and started again on the same port, as a container in CrashLoopBackOff is. Its
simulated pids repeat across the restart, as a container's do. The sidecar must follow the new
run from its first step (``/api/v1/engines``: its run, its last step moving, the old run as the
previous one) and an Xid in the new run must freeze a snapshot of the new run's steps alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ENGINE = "vllm-41000"  # the simulator's engine: its simulated API server pid, the same every start
KILL_AFTER = 1000  # steps of the first run before its SIGKILL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
        return json.loads(r.read())


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except (urllib.error.URLError, OSError, KeyError, ValueError):
            got = None
        if got:
            return got
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - a loopback test URL
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def engine_row(side: str) -> dict[str, Any] | None:
    rows = [r for r in get_json(f"{side}/api/v1/engines")["items"] if r["name"] == ENGINE]
    return rows[0] if rows else None


def snapshots(side: str, kind: str) -> list[dict[str, Any]]:
    items = get_json(f"{side}/api/v1/snapshots?engine={ENGINE}")["items"]
    return [get_json(f"{side}/api/v1/snapshots/{i['id']}", timeout=30) for i in items if i["trigger_kind"] == kind]


def deaths(side: str) -> list[dict[str, Any]]:
    return snapshots(side, "recorder_silent") + snapshots(side, "engine_down")


def test_an_engine_started_again_on_its_port_is_followed_and_its_fault_holds_only_the_new_run(tmp_path: Path) -> None:
    recorder, port, sport = tmp_path / "recorder", free_port(), free_port()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    (tmp_path / "flightrec.yaml").write_text(
        f"engines:\n  - name: {ENGINE}\n    url: http://127.0.0.1:{port}\nrecorder_dir: {recorder}\n"
        f"kmsg: {kmsg}\nnvml: 'off'\nscrape_interval: 0.5\nsnapshot_settle_s: 1.0\n"
    )
    simulate = [
        sys.executable, "-m", "collector.cli", "simulate", "--engines", "1", "--running", "8", "--steps-per-second", "100",
        "--recorder-dir", str(recorder), "--serve-metrics", "--metrics-port", str(port), "--progress-every", "0",
    ]  # fmt: skip
    side = f"http://127.0.0.1:{sport}"
    log = tmp_path / "sidecar.log"
    procs: list[subprocess.Popen[bytes]] = []

    def start_engine(n: int) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(simulate, stdout=open(tmp_path / f"sim{n}.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
        procs.append(proc)
        return proc

    try:
        first = start_engine(1)
        # the engine serving before the sidecar watches it, as on a running node (on a busy
        # machine a sidecar started first scrapes a port not open yet: an engine_down whose
        # incident window then holds the first run's death as a witness of it)
        wait_for("the simulated engine's /metrics", lambda: _answers(f"http://127.0.0.1:{port}/metrics"), 60, tmp_path / "sim1.log")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "collector.cli", "serve", "--config", str(tmp_path / "flightrec.yaml"), "--port", str(sport)]
                + ["--db", f"sqlite:///{tmp_path / 'fr.db'}"],
                stdout=open(log, "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=tmp_path,
            )
        )
        before = wait_for(f"{KILL_AFTER} steps", lambda: (r := engine_row(side)) and (r["last_step"] or 0) >= KILL_AFTER and r, 120, log)
        old_run = before["run"]
        assert old_run and before["previous_run"] is None
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        # The death is seen twice: the ring's writer gone (recorder_silent, 1 s after its last
        # record) and three failed scrapes (engine_down, 1.5 s at this interval). Whichever comes
        # first opens the one snapshot and the other joins it as a witness: on a loaded machine
        # either may be first, and either snapshot holds the old run.
        dead = wait_for("the first run's death", lambda: engine_row(side)["last_step"] and deaths(side), 60, log)
        last_old = max(s["summary"]["last_step"] for s in dead)
        assert last_old >= KILL_AFTER

        start_engine(2)  # the same simulated pids, the same port: only the run differs

        def new_run_stepping() -> dict[str, Any] | None:
            row = engine_row(side)
            return row if row and row["run"] != old_run and row["up"] and 50 <= (row["last_step"] or 0) < last_old else None

        after = wait_for("the new run followed", new_run_stepping, 60, log)
        assert after["previous_run"]["run"] == old_run and after["previous_run"]["last_step"] >= last_old
        with kmsg.open("a") as f:  # an Xid naming the engine's (simulated, repeated) API server pid
            f.write(f"4,9001,{int(time.monotonic() * 1e6)},c;NVRM: Xid (PCI:0000:18:00): 43, pid=41000, name=python3, channel 0x0000000a\n")
        (xid,) = wait_for("the Xid's snapshot", lambda: snapshots(side, "xid"), 60, log)
        engines = get_json(f"{side}/api/v1/engines")["items"]
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    steps = [s["step"] for s in xid["steps"]]
    # the new run alone: from its first step, none of the old run's thousand-odd steps
    assert steps == list(range(1, len(steps) + 1)), steps[:5]
    assert 50 <= steps[-1] < last_old
    assert xid["summary"]["run"] == after["run"] != old_run
    assert xid["summary"]["previous_run"]["run"] == old_run
    # the old run's death froze the old run alone
    (old,) = [s for s in dead if s["summary"].get("run") == old_run]
    assert old["steps"][-1]["step"] == old["summary"]["last_step"] >= KILL_AFTER
    assert [e["name"] for e in engines] == [ENGINE]
