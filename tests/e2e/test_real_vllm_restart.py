"""End to end on a real vLLM (CPU build) that is SIGKILLed and started again on its port, as a
container in CrashLoopBackOff is: the sidecar follows the new run from its first step (its rings
carry the server's start time as their run id), keeps the old run apart as the previous one, and
the fault of the new run (a worker's CUDA error, injected by tests/support/fault_plugin) freezes a
snapshot of the new run's steps alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from test_real_vllm import free_port, get_json, send  # noqa: E402
from vllm_server import default_vllm_python, start_server, stop_group, wait_healthy, write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE = "restart-0"
FIRST_RUN_STEPS = 150  # engine steps of the first run before its SIGKILL
FAULT_AFTER = 40  # steps with work of the second run before the injected CUDA error


def wait_until(what: str, check: Any, timeout: float, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except (urllib.error.URLError, OSError, KeyError, ValueError, TypeError):
            got = None
        if got:
            return got
        time.sleep(1.0)
    pytest.fail(f"timed out waiting for {what}:\n" + "\n".join(p.read_text()[-2500:] for p in logs if p.exists()))


def test_a_real_engine_started_again_on_its_port_is_followed_and_its_fault_holds_only_the_new_run(tmp_path: Path) -> None:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    recorder_dir = tmp_path / "recorder"
    model = write_tiny_model(tmp_path / "model")
    vport = free_port()
    sport = free_port(vport + 1)
    env = {"FLIGHTREC_RECORDER_DIR": str(recorder_dir)}  # joined by the engine's URL
    base, side = f"http://127.0.0.1:{vport}", f"http://127.0.0.1:{sport}"
    log, side_log = tmp_path / "vllm.log", tmp_path / "sidecar.log"
    args = ["--scheduler-cls", "collector.vllm.RecordingScheduler", "--kv-cache-memory-bytes", "4194304"]
    procs: list[subprocess.Popen[bytes]] = []

    def engine_row() -> dict[str, Any]:
        (row,) = [r for r in get_json(f"{side}/api/v1/engines")["items"] if r["name"] == ENGINE]
        return dict(row)

    def snapshots(kind: str) -> list[dict[str, Any]]:
        items = get_json(f"{side}/api/v1/snapshots?engine={ENGINE}")["items"]
        return [get_json(f"{side}/api/v1/snapshots/{i['id']}", timeout=30) for i in items if i["trigger_kind"] == kind]

    def load(n: int, first: int) -> None:
        errors: list[str] = []  # requests in flight at a kill fail: expected
        for i in range(first, first + n):
            threading.Thread(target=send, args=(base, str(model), i, errors), daemon=True).start()

    try:
        first = start_server(python, model, vport, log, env={**env, "FLIGHTREC_FAULT_AFTER_STEPS": None}, extra_args=args)
        procs.append(first)
        (tmp_path / "flightrec.yaml").write_text(
            f"engines:\n  - name: {ENGINE}\n    url: {base}\n    log: {log}\nscrape_interval: 0.5\nnvml: 'off'\nkmsg: 'off'\nsnapshot_settle_s: 2.0\n"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "collector.cli", "serve", "--config", str(tmp_path / "flightrec.yaml"), "--port", str(sport)]
                + ["--db", f"sqlite:///{tmp_path / 'fr.db'}"],
                stdout=open(side_log, "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
                cwd=tmp_path,
            )
        )
        wait_healthy(base, first, 300.0)
        load(4, 0)
        before = wait_until(
            f"{FIRST_RUN_STEPS} steps of the first run", lambda: (r := engine_row())["last_step"] >= FIRST_RUN_STEPS and r, 300, [side_log, log]
        )
        old_run = before["run"]
        assert old_run > 10**12 and before["previous_run"] is None  # the server's start time, in ms
        os.killpg(first.pid, signal.SIGKILL)  # the whole server: API server, engine core
        first.wait()
        # seen by the rings gone silent or by three failed scrapes, whichever came first: one snapshot
        dead = wait_until("the first run's death", lambda: snapshots("recorder_silent") + snapshots("engine_down"), 60, [side_log])
        last_old = max(s["summary"]["last_step"] for s in dead)

        second = start_server(python, model, vport, log, env={**env, "FLIGHTREC_FAULT_AFTER_STEPS": str(FAULT_AFTER)}, extra_args=args)
        procs.append(second)
        wait_healthy(base, second, 300.0)
        load(4, 100)
        after = wait_until("the second run followed", lambda: (r := engine_row())["run"] != old_run and r["last_step"] and r, 120, [side_log, log])
        assert after["previous_run"]["run"] == old_run and after["previous_run"]["last_step"] >= FIRST_RUN_STEPS

        def complete(doc: dict[str, Any]) -> bool:
            kinds = {e["kind"] for e in doc.get("events", [])}
            return bool(doc.get("summary", {}).get("amended_at")) and bool(doc.get("steps")) and "cuda_error" in kinds

        # Whichever witness of the new run's death came first opened its snapshot: the log's
        # error line, or (on a busy machine, the log read a moment later) the engine core's ring
        # gone silent; either way the CUDA error is among its events and it is the new run's.
        faults = ("cuda_error", "engine_fatal", "engine_dead", "recorder_silent")
        snap = wait_until(
            "the new run's fault",
            lambda: [d for k in faults for d in snapshots(k) if complete(d) and d["summary"].get("run") == after["run"]],
            180,
            [side_log, log],
        )[0]
    finally:
        for proc in reversed(procs):
            stop_group(proc)

    steps = [s["step"] for s in snap["steps"]]
    assert snap["summary"]["run"] == after["run"] != old_run
    assert snap["summary"]["previous_run"]["run"] == old_run
    # the new run's steps alone: a run of its own numbers, fewer than the old run had
    assert steps == sorted(set(steps)) and steps[-1] < last_old, (steps[:5], steps[-5:], last_old)
    assert steps[-1] >= FAULT_AFTER
    # the old run's death froze the old run alone
    olds = [s for s in dead if s["summary"].get("run") == old_run]
    assert olds and all(s["summary"]["last_step"] >= FIRST_RUN_STEPS and "previous_run" not in s["summary"] for s in olds)
