"""Phase ``hang`` of the GPU tier: a kernel that spins inside a step of a real vLLM engine
(the probe plugin's ``spin`` drill), watched from outside and from the sidecar, released, fired
again and left hung, and the engine killed (scripts/gpu/vllm_gpu_cost_hang.py says how)."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import open_loop as ol
from gpu_run import SHUTDOWN_S, Run
from gpu_tier_lib import Receiver, Result, Sidecar, Vllm, _one, cmdline, descendants, get_json, log, stop
from hang_contract import HANG_EVENT, RESUME_EVENT, SYNC, engine_state, hang_events, pages, snapshot_hang_view, wedge_snapshots

# the phase besides its first hold: the load coming up, the return (at most 15 s), the second
# hang (30 s), the kill, the verdicts
HANG_REST_S = 75.0


def health(base: str) -> tuple[int | None, float]:
    t = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
            return resp.status, round(1000 * (time.monotonic() - t), 1)
    except urllib.error.HTTPError as exc:
        return exc.code, round(1000 * (time.monotonic() - t), 1)
    except (urllib.error.URLError, OSError):
        return None, round(1000 * (time.monotonic() - t), 1)


class Nvml:
    """GPU 0's utilisation, for this script's own view (None where NVML is not there)."""

    def __init__(self, on: bool) -> None:
        self.read: Any = None
        if not on:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.read = lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as exc:  # noqa: BLE001 - unknown, not zero
            log(f"NVML not readable here: {exc!r}")

    def util(self) -> int | None:
        try:
            return None if self.read is None else self.read()
        except Exception:  # noqa: BLE001
            return None


def py_spy_dump(py_spy: str | None, pid: int | None) -> dict[str, Any]:
    """This script's own look at a process's Python stacks (``--nonblocking``: never paused)."""
    if not py_spy or pid is None:
        return {"error": "no py-spy" if not py_spy else "no pid"}
    t = time.monotonic()
    try:
        p = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": repr(exc)}
    text = p.stdout + (p.stderr if p.returncode else "")
    return {
        "rc": p.returncode,
        "ms": round(1000 * (time.monotonic() - t), 1),
        "in_sync": bool(SYNC.search(text)),
        "text": text[-20000:],
    }


def main_thread(text: str | None, frames: int = 8) -> list[str] | None:
    """The top frames of a py-spy dump's main thread (its first thread: the engine core's busy
    loop), innermost first."""
    if not text:
        return None
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith("Thread ") and "MainThread" in x), None)
    if start is None:
        return None
    out = []
    for x in lines[start + 1 :]:
        if not x.startswith(" "):
            break
        out.append(x.strip())
    return out[:frames]


def engine_processes(r: Vllm) -> dict[str, int]:
    """The engine core and its workers (a worker of its own on the CPU build or with TP > 1;
    with TP=1 on a GPU the engine core runs the model itself)."""
    out: dict[str, int] = {}
    for pid in descendants(r.proc.pid):
        cmd = cmdline(pid)
        if "EngineCore" in cmd:
            out["engine_core"] = pid
        elif "VLLM::Worker" in cmd:
            out[f"worker_{len([k for k in out if k.startswith('worker')])}"] = pid
    return out


def look_twice(py_spy: str | None, procs: dict[str, int]) -> dict[str, Any]:
    """Each process's stacks, twice, 2 s apart, with its main thread's top frames each time."""
    first = {name: py_spy_dump(py_spy, pid) for name, pid in procs.items()}
    time.sleep(2.0)
    second = {name: py_spy_dump(py_spy, pid) for name, pid in procs.items()}
    out = {}
    for name, pid in procs.items():
        top, later = main_thread(first[name].get("text")), main_thread(second[name].get("text"))
        out[name] = {**first[name], "pid": pid, "main_thread": top, "main_thread_2s_later": later}
    return out


def watch_hang(
    args: argparse.Namespace, r: Vllm, side: Sidecar, recv: Receiver, nvml: Nvml, launched: float, until_all: bool, hold_s: float, py_spy: str | None
) -> dict[str, Any]:
    """Poll while the engine hangs: /health, NVML, the engine's state, wedge events, snapshots,
    pages; a py-spy dump of the engine core 3 s in. Returns when the event, the snapshot and the
    page are all seen (``until_all``) or only the event (else), or after ``hold_s``."""
    out: dict[str, Any] = {"health": [], "util": [], "states": [], "first_seen": {}}
    seen = out["first_seen"]
    t_end = time.time() + hold_s
    dumped = False
    while time.time() < t_end:
        now = time.time()
        code, ms = health(r.base)
        out["health"].append([round(now - launched, 2), code, ms])
        out["util"].append([round(now - launched, 2), nvml.util()])
        try:
            st = engine_state(side, r.name)
            out["states"].append([round(now - launched, 2), st.get("state"), st.get("steps_received")])
            if st.get("state") == "wedged" and "state_wedged" not in seen:
                seen["state_wedged"] = now
            ev = [e for e in hang_events(side, r.name, launched) if e.get("kind") == HANG_EVENT]
            if ev and "event" not in seen:
                seen["event"], out["event"] = now, ev[0]
            snaps = wedge_snapshots(side, r.name, launched)
            if snaps and "snapshot" not in seen:
                seen["snapshot"], out["snapshot"] = now, snaps[0]
            # the stacks come with the snapshot's amendment (its first commit says "reading")
            amended = next(
                (x for x in snaps if x.get("id") == (out.get("snapshot") or {}).get("id") and (x.get("summary") or {}).get("amended_at")), None
            )
            if amended and "amended" not in seen:
                seen["amended"], out["snapshot"] = now, amended
            got = pages(recv, launched, (out.get("snapshot") or {}).get("id"))
            if got and "page" not in seen:
                seen["page"], out["page"] = got[0][0], got[0][1]
        except (urllib.error.URLError, OSError, ValueError) as exc:
            out.setdefault("sidecar_errors", []).append(repr(exc)[:200])
        if not dumped and now - launched >= 3.0:  # two looks 2 s apart: a stuck thread does not move
            out["py_spy"] = look_twice(py_spy, engine_processes(r))
            dumped = True
        done = "event" in seen and (not until_all or ("amended" in seen and "page" in seen))
        if done and dumped:
            break
        time.sleep(0.25)
    return out


class Load:
    """Lanes of long requests on a server, each sending its next when the last ends, in a thread
    of this script, until ``stop()``: requests running when the kernel spins, and the witness
    that they complete after its release."""

    def __init__(self, r: Vllm, lanes: int, isl: int, osl: int) -> None:
        self.results: list[Result] = []
        self._stop = threading.Event()
        host, port = r.base.removeprefix("http://").split(":")

        async def lane(k: int) -> None:
            i = 70_000_000 + k
            while not self._stop.is_set():
                res = Result(index=i, prompt_len=isl, scheduled=time.time())
                self.results.append(res)
                await _one(host, int(port), r.model, i, isl, osl, "hang-", prompt=ol.unique_prompt(i, isl), res=res)
                if res.error:
                    await asyncio.sleep(0.5)  # the server gone: do not spin on refused connections
                i += lanes

        async def lanes_all() -> None:
            await asyncio.gather(*(lane(k) for k in range(lanes)))

        self.thread = threading.Thread(target=lambda: asyncio.run(lanes_all()), daemon=True, name="hang-load")
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def wait_launched(fire: Path, n: int, timeout: float = 30.0) -> dict[str, Any] | None:
    path = Path(str(fire) + ".launched")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rec = json.loads(path.read_text())
            if rec.get("n") == n:
                return dict(rec)
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    return None


def release(fire: Path, launch: dict[str, Any]) -> float:
    """Let the kernel end: 1 into its /dev/shm flag (from this process: the engine's own
    threads may all be blocked) and the release file its own watcher thread looks for."""
    import flightrec_spin  # the probe's module: on sys.path through probe_site

    t = time.time()
    if launch.get("flag"):
        flightrec_spin.release_file(str(launch["flag"]))
    Path(str(fire) + ".release").write_text("release")
    return t


def rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(1000 * (a - b), 1)


def phase_hang(args: argparse.Namespace, run: Run, r: Vllm, side: Sidecar, recv: Receiver, fire: Path, py_spy: str | None) -> None:
    checks = run.checks["hang"]
    res = run.results["hang"]
    nvml = Nvml(on=not args.smoke)
    kind = "block" if args.smoke else "spin"
    # requests of a few seconds: always some running when the kernel spins, and those that ran
    # through the first hang end before the second
    lanes, isl, osl = (4, 32, 48) if args.smoke else (args.hang_lanes, 256, 512)
    res.update(kind=kind, engine=r.name, load={"lanes": lanes, "isl": isl, "osl": osl}, py_spy=py_spy, hold_s=args.hang_hold_s)
    res["util_before"] = nvml.util()
    load = Load(r, lanes, isl, osl)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (engine_state(side, r.name).get("running") or 0) >= lanes - 1:
            break
        time.sleep(0.3)
    time.sleep(2.0)
    before = engine_state(side, r.name)
    res["before"] = before
    # -- 1. spin, watch, release -------------------------------------------------------------------
    fire.write_text("1")
    launch = wait_launched(fire, 1)
    res["launch1"] = launch
    if not checks.check(f"hang: the {kind} kernel was launched inside a step", launch is not None, None):
        return
    assert launch is not None
    lt = float(launch["ts"])
    # the first hang gets its hold unless the run's end is near: 60 s stay for the rest
    hold1 = max(10.0, min(args.hang_hold_s, run.left() - SHUTDOWN_S - 60.0))
    w1 = watch_hang(args, r, side, recv, nvml, lt, until_all=True, hold_s=hold1, py_spy=py_spy)
    res["hang1"] = w1
    t_rel = release(fire, launch)
    res["released_after_s"] = round(t_rel - lt, 2)
    # -- the return ----------------------------------------------------------------------------
    resumed: dict[str, Any] = {}
    deadline = time.monotonic() + 15
    steps_at = (w1["states"][-1][2] if w1["states"] else None) or 0
    while time.monotonic() < deadline:
        st = engine_state(side, r.name)
        now = time.time()
        if (st.get("steps_received") or 0) > steps_at and "steps_again" not in resumed:
            resumed["steps_again"] = now
        if st.get("state") == "ok" and "state_ok" not in resumed:
            resumed["state_ok"] = now
        try:
            ev = [e for e in hang_events(side, r.name, lt) if e.get("kind") == RESUME_EVENT]
        except (urllib.error.URLError, OSError, ValueError):
            ev = []
        if ev and "event" not in resumed:
            resumed["event"], resumed["event_body"] = now, ev[0]
        if {"steps_again", "state_ok", "event"} <= set(resumed):
            break
        time.sleep(0.25)
    flag1 = None
    if launch.get("flag"):
        import flightrec_spin

        flag1 = flightrec_spin.read_file(str(launch["flag"]))
    res["resume"] = {**resumed, "flag": flag1}
    time.sleep(args.hang_settle_s)
    # -- 2. spin again, leave it hung, kill the engine ----------------------------------------------
    fire.write_text("2")
    launch2 = wait_launched(fire, 2)
    res["launch2"] = launch2
    w2: dict[str, Any] = {}
    if launch2 is not None:
        hold2 = max(5.0, min(args.hang_hold_s, run.left() - SHUTDOWN_S - 15.0))
        w2 = watch_hang(args, r, side, recv, nvml, float(launch2["ts"]), until_all=False, hold_s=hold2, py_spy=py_spy)
    res["hang2"] = w2
    t_kill = time.time()
    stop(r.proc, grace=5.0)  # SIGTERM, then SIGKILL: a thread blocked in the driver runs no handler
    res["kill"] = {"exited_after_ms": rel(time.time(), t_kill), "returncode": r.proc.returncode}
    util_after = []
    for _ in range(10):
        util_after.append(nvml.util())
        if util_after[-1] is not None and util_after[-1] < 10:
            break
        time.sleep(1.0)
    res["util_after_kill"] = util_after
    load.stop()
    # -- verdicts ----------------------------------------------------------------------------------
    seen = w1["first_seen"]
    codes = [h[1] for h in w1["health"]]
    checks.check(
        "hang: vLLM's /health answered 200 all through the hang", len(codes) >= 3 and all(c == 200 for c in codes), sorted(set(codes), key=str)
    )
    if not args.smoke:
        busy = [u for t, u in w1["util"] if u is not None and t >= 2.0]  # NVML averages over up to 1 s
        checks.check("hang: NVML read the GPU busy (>= 90%) through the hang", bool(busy) and min(busy) >= 90, busy[:12])
    spy = w1.get("py_spy") or {}
    want = "synchronize" if not args.smoke else "_hang"
    stuck = [
        n for n, d in spy.items() if any(want in f for f in d.get("main_thread") or []) and d.get("main_thread") == d.get("main_thread_2s_later")
    ]
    res["stuck_in"] = stuck
    checks.check(
        f"hang: the engine's main thread (py-spy, this script) waits in {want}, the same 2 s later",
        bool(stuck),
        {n: {k: d.get(k) for k in ("rc", "ms", "error", "main_thread")} for n, d in spy.items()},
    )
    checks.check("hang: the sidecar reported the wedge (engine_wedged)", "event" in seen, None)
    checks.check("hang: the engine's state was wedged during the hang", "state_wedged" in seen, [s[1] for s in w1["states"]][-5:])
    snap = w1.get("snapshot")
    view: dict[str, Any] = {}
    stacks_of: Any = None
    if snap:
        doc = get_json(f"{side.base}/api/v1/snapshots/{snap['id']}", timeout=60, token=side.token)
        view = snapshot_hang_view(doc, lt)
        stacks_of = doc.get("stacks")
        steps = doc.get("steps") or []
        res["snapshot_view"] = {**view, "steps": len(steps), "last_step": max((s["step"] for s in steps), default=None)}
        last_ts = max((s.get("ts") or 0 for s in steps), default=None) or None
    else:
        last_ts = None
    checks.check("hang: a snapshot triggered by the wedge", snap is not None, None)
    if args.smoke:  # the CPU build runs the model in a worker process: the block is there
        checks.check(
            "hang: the snapshot holds the blocked step's stack (the drill's _hang)", "_hang" in json.dumps(stacks_of), view.get("stacks_status")
        )
    else:
        checks.check(
            "hang: the snapshot holds the engine core's stack at the synchronisation point",
            bool(view.get("engine_core_in_sync")),
            {k: view.get(k) for k in ("stacks_status", "stacks_reasons", "engine_core_state", "engine_core_blocking_frame")},
        )
    if not args.smoke:
        checks.check(
            "hang: the snapshot holds NVML's view of the busy GPU", bool(view.get("nvml_busy")), view.get("nvml_util_in_samples_after_launch")
        )
    checks.check("hang: the page reached the receiver", "page" in seen, [(a.get("labels") or {}).get("alertname") for _, a in recv.alerts()][-5:])
    checks.check(
        "hang: released, the engine stepped again, said so (engine_resumed) and its state went back to ok",
        {"steps_again", "state_ok", "event"} <= set(resumed),
        sorted(resumed),
    )
    # the requests that were streaming when the kernel spun: tokens again after the release
    across = [x for x in load.results if x.chunks and x.chunks[0] < lt and any(t > t_rel for t in x.chunks)]
    res["load_results"] = {
        "requests": len(load.results),
        "completed": sum(1 for x in load.results if x.ok),
        "streaming_at_the_hang_and_after_the_release": len(across),
        "of_those_completed": sum(1 for x in across if x.ok),
        "errors": sorted({str(x.error)[:120] for x in load.results if x.error})[:3],
    }
    checks.check(
        "hang: requests streaming when the kernel spun streamed again after the release",
        bool(across),
        res["load_results"],
    )
    if not args.smoke and flag1 is not None:
        checks.check("hang: the kernel ended by its release (not its time limit)", flag1.get("ended") == "released", flag1)
    seen2 = w2.get("first_seen") or {}
    checks.check("hang: fired again and left hung, the wedge was reported again", "event" in seen2, sorted(seen2))
    if not args.smoke:
        checks.check("hang: the engine killed, the GPU idle again (NVML < 10%)", any(u is not None and u < 10 for u in util_after), util_after)
    ev = w1.get("event") or {}
    res["timings_ms"] = {
        "launch_to_event": rel(ev.get("ts"), lt),
        "launch_to_event_seen": rel(seen.get("event"), lt),
        "launch_to_state_wedged_seen": rel(seen.get("state_wedged"), lt),
        "launch_to_snapshot_committed": rel((snap or {}).get("created_at"), lt),
        "launch_to_page_received": rel(seen.get("page"), lt),
        "last_step_to_launch": rel(lt, last_ts),
        "last_step_to_event": rel(ev.get("ts"), last_ts),
        "last_step_to_snapshot_committed": rel((snap or {}).get("created_at"), last_ts),
        "last_step_to_page_received": rel(seen.get("page"), last_ts),
        "release_to_steps_again_seen": rel(resumed.get("steps_again"), t_rel),
        "release_to_resumed_event_seen": rel(resumed.get("event"), t_rel),
        "release_to_state_ok_seen": rel(resumed.get("state_ok"), t_rel),
        "second_launch_to_event_seen": rel(seen2.get("event"), (launch2 or {}).get("ts")),
    }
    log(f"hang timings: {res['timings_ms']}")
