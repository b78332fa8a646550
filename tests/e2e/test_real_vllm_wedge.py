"""End to end on a real vLLM (CPU build): an engine that stops stepping with 8 requests running
and none waiting is seen as wedged, frozen with its processes' stacks, paged, and reported
unhealthy, while vLLM's own /health keeps answering 200; when it steps again the sidecar says it
resumed and how long it was stuck, and the engine is ok again. An engine idle for minutes after a
batch is never wedged.

One server for every case (vLLM's start-up is most of the time), with two TP workers (the CPU
build runs ``--tensor-parallel-size 2``): the recorder and ``tests/support/wedge_scheduler.py`` in
the engine core, the fault plugin's worker wedge in the workers (no fault), ``flightrec serve``
watching it and paging a real Alertmanager whose receiver is a webhook here. In order:

1. a short batch, then the engine idle for ``IDLE_S``: no wedge, ``idle`` and 200 throughout;
2. 8 long requests running, none waiting, the engine core blocked inside ``schedule()`` (the
   scheduler's ``hold_while_wedged``, while a file exists): the event, the snapshot whose stacks
   show that frame blocking the engine core, the page, state ``wedged`` and 503; the file
   removed: resumed, ok, 200;
3. the same requests, TP rank 1 blocked before its forward: the same, and the two workers'
   stacks told apart (rank 1 in its blocking frame, rank 0 inside the model's forward, waiting
   for rank 1 in the collective);
4. the same requests, the engine core stopped with SIGSTOP: the same, the snapshot saying the
   process is stopped; SIGCONT: resumed, ok.

Needs the vLLM virtualenv (``scripts/vllm-cpu-env.sh``; ``FLIGHTREC_VLLM_PYTHON``), py-spy and an
Alertmanager binary. 3-4 minutes beside vLLM's start-up (1-2.5 minutes here).
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from collector.stacks import pyspy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from alertmanager import find_binary as find_alertmanager  # noqa: E402
from vllm_server import default_vllm_python  # noqa: E402
from wedge_rig import Wedge, WedgeRig, wait_for  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.alertmanager]

IDLE_S = 120.0  # the idle engine watched for a wedge that must not come
FOLLOW_S = 120.0  # event, snapshot and page: well beyond the 20 s / 30 s goals (bench/bench_wedge_real.py times them)


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    if pyspy.find_binary() is None:
        pytest.skip("py-spy is a dependency: pip install -e .")
    if find_alertmanager() is None:
        pytest.skip("no alertmanager binary")
    r = WedgeRig(tmp_path, python, extra_args=["--tensor-parallel-size", "2"], wedge_rank=1)
    try:
        yield r.start()
    finally:
        r.stop()


def vllm_health(rig: WedgeRig) -> int:
    with urllib.request.urlopen(f"{rig.vllm}/health", timeout=10) as resp:
        return int(resp.status)


def check_wedged(rig: WedgeRig, wedge: Wedge) -> tuple[dict[str, Any], dict[str, Any]]:
    """What every wedge must show; returns the engine core's process and the whole stacks part."""
    assert wedge.event is not None, "no engine_wedged event\n" + rig.tails()
    assert wedge.snapshot is not None, "no snapshot of the wedge\n" + rig.tails()
    assert wedge.page is not None, f"no {rig.engine} page: {rig.hook.notifications}\n" + rig.tails()
    # the engine is reported wedged, by the API, the health verdict and the metrics, while
    # vLLM's own /health still says 200 (the silence this is for)
    item = rig.engine_item()
    assert item["state"] == "wedged" and item["state_since"] is not None, item
    status, body = rig.health()
    assert status == 503, (status, body)
    assert rig.metric("flightrec_engine_wedged") == 1.0
    since = rig.metric("flightrec_engine_seconds_since_step")
    # past the threshold's floor (10 s by default), not past the time since the core's last step
    assert since is not None and 10.0 <= since <= time.time() - wedge.last_step.ts + 1.0, since
    assert vllm_health(rig) == 200
    # the event names the engine, after the last step the core wrote
    assert wedge.event["engine"] == rig.engine and wedge.event["severity"] == "critical", wedge.event
    assert wedge.event["ts"] >= wedge.last_step.ts
    # the snapshot: the steps up to the wedge, the last one the core's last, 8 running, none waiting
    snap = wedge.snapshot
    assert snap["last_step"] == wedge.last_step.step, (snap["last_step"], wedge.last_step.step)
    doc = rig.get_snapshot(snap["id"])
    last = doc["steps"][-1]
    assert last["step"] == wedge.last_step.step and last["running"] == 8, last
    # the page: critical, the snapshot's link with it
    labels, annotations = wedge.page["labels"], wedge.page.get("annotations", {})
    assert labels["severity"] == "critical", labels
    assert any(f"/snapshots/{snap['id']}" in str(v) for v in annotations.values()) or f"/snapshots/{snap['id']}" in str(
        wedge.page.get("generatorURL")
    ), wedge.page
    # the stacks of every process, read twice: the engine core's is the one stuck
    stacks = rig.stacks(snap["id"])
    assert stacks["status"] in ("captured", "partial"), stacks.get("reasons")
    roles = {p["role"] for p in stacks["processes"]}
    assert {"api_server", "engine_core"} <= roles, roles
    (core,) = [p for p in stacks["processes"] if p["role"] == "engine_core"]
    assert core["pid"] == rig.core_pid()
    return core, stacks


def check_resumed(rig: WedgeRig, wedge: Wedge, released: float) -> None:
    before = {e["id"] for e in rig.events("engine_resumed")}
    resumed = wait_for("engine_resumed", lambda: [e for e in rig.events("engine_resumed") if e["id"] not in before], 60)
    (event,) = resumed
    stuck = event["data"]["stuck_s"]
    assert released - wedge.started - 5.0 <= stuck <= time.time() - wedge.last_step.ts + 1.0, (stuck, released - wedge.started)
    wait_for("state ok again", lambda: rig.engine_item()["state"] == "ok", 30)
    assert rig.health()[0] == 200
    assert rig.metric("flightrec_engine_wedged") == 0.0
    moved = rig.ring.poll()
    assert moved is not None and moved.step > wedge.last_step.step


def test_a_wedged_real_engine_is_seen_frozen_paged_and_reported(rig: WedgeRig) -> None:
    # 1. a short batch, then the engine idle for minutes: never wedged
    for t in rig.send(8, max_tokens=64):
        t.join(timeout=300)
    rig.idle()
    assert rig.errors == []
    seen: list[dict[str, Any]] = []
    idle = lambda: seen.append(rig.engine_item()) or seen[-1]["state"] == "idle"  # noqa: E731
    assert wait_for("state idle", idle, 30, every=0.5), seen[-1:]
    deadline = time.monotonic() + IDLE_S
    while time.monotonic() < deadline:
        assert rig.engine_item()["state"] == "idle"  # holds nothing: neither wedged nor busy
        assert rig.health()[0] == 200
        time.sleep(5.0)
    assert rig.events("engine_wedged") == []
    assert rig.metric("flightrec_engine_wedged") == 0.0

    # 2. 8 long requests running, none waiting, the engine core blocked inside its step
    rig.load(8)
    wedge = rig.follow(rig.wedge("step"), FOLLOW_S)
    core, stacks = check_wedged(rig, wedge)
    frame = core["blocking"]["frame"]
    assert core["state"] == "stuck" and frame["function"] == "hold_while_wedged", core["blocking"]
    assert frame["file"].endswith("wedge_scheduler.py"), frame
    main = core["threads"][0]  # and the frames above it: inside vLLM's step
    assert any("step" in f["function"] and f["file"] == "vllm/v1/engine/core.py" for f in main["frames"]), main["frames"][:12]
    check_resumed(rig, wedge, rig.release(wedge))

    # 3. the same batch, one TP worker (rank 1) blocked before its forward: the other waits for
    # it inside the forward's collective, the engine core for both
    rig.load(8)
    wedge = rig.follow(rig.wedge("worker"), FOLLOW_S)
    core, stacks = check_wedged(rig, wedge)
    workers = {p["title"]: p for p in stacks["processes"] if p["role"] == "worker"}
    assert sorted(workers) == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"], sorted(workers)
    stuck, waiting = workers["VLLM::Worker_TP1"], workers["VLLM::Worker_TP0"]
    assert stuck["blocking"]["frame"]["function"] == "hold_worker_while_wedged", stuck["blocking"]
    assert waiting["blocking"] is not None and waiting["blocking"]["frame"]["function"] != "hold_worker_while_wedged", waiting["blocking"]
    assert any(f["function"] == "LlamaModel.forward" for f in waiting["threads"][0]["frames"]), waiting["threads"][0]["frames"][:16]
    assert not any(f["function"] == "LlamaModel.forward" for f in stuck["threads"][0]["frames"])
    assert core["blocking"] is None or core["blocking"]["frame"]["function"] != "hold_while_wedged", core["blocking"]
    check_resumed(rig, wedge, rig.release(wedge))

    # 4. the same batch, the engine core stopped (SIGSTOP): the snapshot says so
    rig.load(8)
    wedge = rig.follow(rig.wedge("sigstop"), FOLLOW_S)
    core, stacks = check_wedged(rig, wedge)
    assert core["os_state"] == "T", core
    assert any(n.startswith(f"engine_core {core['pid']} is stopped") for n in stacks["notes"]), stacks["notes"]
    check_resumed(rig, wedge, rig.release(wedge))
