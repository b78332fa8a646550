"""A ``vllm.general_plugins`` entry point for the GPU tier (scripts/gpu/vllm_gpu_tier.py): an
independent witness of what the engine did, and the drill's faults. Inert unless its variables
are set; it only ever touches its own processes.

- ``FLIGHTREC_PROBE_DIR``: in the engine-core process, count every ``Scheduler.schedule()`` call
  (vLLM's base class, patched before the engine builds its scheduler, so the count does not
  depend on the recorder's own step numbers) and those that scheduled tokens; time the
  recorder's per-step work where it runs (``_SchedRecorder.scheduled`` in the engine core,
  ``FlightRecorderStatLogger._record`` in the API server; with ``FLIGHTREC_PROBE_RECORDER=1``)
  and the time between consecutive steps, by the number of running requests; time the
  process's garbage collections (``gc.callbacks``, by generation); write it all to
  ``steps.<pid>.json`` every 0.25 s (and at every step once a drill fired). Timings are kept as
  log-spaced histograms (8 bins per octave, about 9% wide), a few hundred numbers whatever the
  run's length: the witness's own write must cost the engine nothing it could see (a first
  version kept every sample and serialised up to 100,000 of them every 0.2 s while holding the
  GIL, which stalled the engine core and the API server for milliseconds at a time, more in
  the run with the recorder, which has more series).
- ``FLIGHTREC_DRILL_FIRE=PATH``: once PATH exists, the worker launches a faulting kernel on the
  model's stream right after a step's forward was queued, and writes ``PATH.launched`` (the
  launch's wall time). ``FLIGHTREC_DRILL_KIND``: ``trap`` (a kernel executing ``trap``: a real
  ``unspecified launch failure``, Xid 43) or ``store`` (a store to address 0x10: ``an illegal
  memory access``, Xid 31); ``raise`` raises vLLM's CUDA error text in Python instead (no GPU
  fault: for a smoke run of the script on vLLM's CPU build).
- ``FLIGHTREC_DRILL_KIND=spin``: a hang, not a fault, and one that can end, as often as PATH
  appears (each launch removes PATH): a kernel that spins on the model's stream until released
  (``flightrec_spin.py``), so the engine core blocks in its next synchronisation with the GPU
  at 100% utilisation while vLLM's ``/health`` says 200. ``PATH.launched`` (JSON, rewritten at
  each launch) gives the launch's time and step, its number and the flag's /dev/shm file: write
  1 into that file, or create ``PATH.release``, to let the kernel end.
  ``FLIGHTREC_DRILL_SPIN_MAX_S`` (default 120) bounds each spin on the GPU itself. ``block``
  does the same in Python (the step's hook sleeps until released): the CPU build's stand-in.
"""

from __future__ import annotations

import collections
import gc
import json
import math
import os
import threading
import time
from typing import Any

_loaded = False
_lock = threading.Lock()
_state: dict[str, Any] = {
    "pid": os.getpid(),
    "schedule_calls": 0,
    "schedule_with_tokens": 0,
    "execute_model_calls": 0,
    "forward_calls": 0,
    "drill_launched_at": None,
    "drill_step": None,
    "timings": {},  # name -> {running bucket: histogram}
    "step_gaps_ns": {},  # running bucket -> histogram of ns between consecutive schedule() calls
    "gc_ns": {},  # generation -> histogram of each collection's duration
    "writes": {"n": 0, "max_ns": 0, "total_ns": 0},  # the probe's own file writes
}
_BUCKETS = ((0, 0), (1, 15), (16, 63), (64, 191), (192, 1 << 30))
_BINS_PER_OCTAVE = 8
_fired = False


def _bucket(running: int) -> str:
    for lo, hi in _BUCKETS:
        if lo <= running <= hi:
            return f"{lo}-{hi}" if hi < (1 << 30) else f"{lo}+"
    return "?"


def _process_name() -> str:
    """vLLM names its processes (``VLLM::EngineCore``, ``VLLM::Worker``): which one this is."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read(200).split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def _add(hist: dict[str, Any], value: int) -> None:
    """One sample into a histogram: count, sum, max and the count of its log-spaced bin
    (bin b holds [2**(b/8), 2**((b+1)/8)) ns)."""
    hist["n"] = hist.get("n", 0) + 1
    hist["sum"] = hist.get("sum", 0) + value
    if value > hist.get("max", 0):
        hist["max"] = value
    b = int(math.log2(value) * _BINS_PER_OCTAVE) if value > 0 else 0
    bins = hist.setdefault("bins", {})
    bins[b] = bins.get(b, 0) + 1


def _sample(series: dict[str, Any], running: int, value: int) -> None:
    _add(series.setdefault(_bucket(running), {}), value)


def _write(directory: str) -> None:
    t0 = time.perf_counter_ns()
    _fold_gc()
    with _lock:
        _state["process"] = _process_name()
        body = json.dumps(_state)
    path = os.path.join(directory, f"steps.{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(body)
    os.replace(tmp, path)
    dt = time.perf_counter_ns() - t0
    with _lock:
        w = _state["writes"]
        w["n"] += 1
        w["total_ns"] += dt
        w["max_ns"] = max(w["max_ns"], dt)


def _writer(directory: str) -> None:
    while True:
        time.sleep(0.25)
        try:
            _write(directory)
        except OSError:
            pass


_gc_started = [0]
# (generation, ns) of each collection, appended by the collector's callback and folded into the
# histograms by the writer: the callback takes no lock (a collection can start inside any
# allocation, also one made while this thread holds ``_lock``: taking it there would deadlock)
_gc_done: collections.deque[tuple[int, int]] = collections.deque(maxlen=100_000)


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter_ns()
    elif _gc_started[0]:
        _gc_done.append((int(info.get("generation", -1)), time.perf_counter_ns() - _gc_started[0]))
        _gc_started[0] = 0


def _fold_gc() -> None:
    while _gc_done:
        gen, dt = _gc_done.popleft()
        with _lock:
            _add(_state["gc_ns"].setdefault(str(gen), {}), dt)


def _timed(cls: Any, name: str, series: str, running_of: Any) -> None:
    original = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return original(self, *args, **kwargs)
        finally:
            dt = time.perf_counter_ns() - t0
            try:
                running = int(running_of(args, kwargs))
            except Exception:  # noqa: BLE001 - a witness never breaks the engine
                running = -1
            with _lock:
                _sample(_state["timings"].setdefault(series, {}), running, dt)

    setattr(cls, name, wrapper)


def _count_schedule(directory: str) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.schedule
    last = [0]

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        now = time.perf_counter_ns()
        running = len(getattr(self, "running", ()) or ())
        with _lock:
            _state["schedule_calls"] += 1
            if getattr(out, "total_num_scheduled_tokens", 0):
                _state["schedule_with_tokens"] += 1
            if last[0] and running:
                _sample(_state["step_gaps_ns"], running, now - last[0])
            last[0] = now
        if _fired:
            _write(directory)  # the process may die at any step now: every count is kept
        return out

    Scheduler.schedule = schedule


def _recorder_timings() -> None:
    try:  # the engine core: the per-request rows
        from collector.vllm import scheduler as rs

        _timed(rs._SchedRecorder, "scheduled", "sched_recorder_ns", lambda a, k: len(a[0]))
    except Exception:  # noqa: BLE001 - not installed here: nothing to time
        pass
    try:  # the API server: the stat logger
        from collector.vllm import plugin as rp

        _timed(
            rp.FlightRecorderStatLogger,
            "_record",
            "stat_logger_ns",
            lambda a, k: getattr(a[0], "num_running_reqs", -1) if a and a[0] is not None else -1,
        )
    except Exception:  # noqa: BLE001
        pass


def _launched(fire: str, record: dict[str, Any]) -> None:
    with _lock:
        _state["drill_launched_at"] = record["ts"]
        _state["drill_step"] = record["step"]
    tmp = fire + ".launched.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
    os.replace(tmp, fire + ".launched")


def _hang(fire: str, kind: str, n: int) -> None:
    """One hang of the ``spin``/``block`` drill, right after a step's forward was queued."""
    limit_s = float(os.environ.get("FLIGHTREC_DRILL_SPIN_MAX_S", "120"))
    release = fire + ".release"
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "kind": kind,
        "n": n,
        "step": _state["schedule_calls"] or None,  # counted with FLIGHTREC_PROBE_DIR only
        "forward_calls": _state["forward_calls"],
        "limit_s": limit_s,
    }
    if kind == "block":  # the CPU build's stand-in: the step's own thread waits in Python
        record.update(ts=time.time(), flag=None, mode="python")
        _launched(fire, record)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not os.path.exists(release):
            time.sleep(0.005)
        try:
            os.unlink(release)
        except OSError:
            pass
        return
    import flightrec_spin
    import torch

    flag = flightrec_spin.Flag(str(n))
    record["ts"] = flightrec_spin.launch(flag, limit_s, torch.cuda.current_stream().cuda_stream)
    record.update(flag=flag.path, mode=flag.mode, flag_error=flag.error)
    _hangs.append(flag)  # kept alive (and readable) for the process's life
    flightrec_spin.watch_release(flag, release, limit_s)
    _launched(fire, record)


_hangs: list[Any] = []


def _drill(fire: str, kind: str) -> None:
    from vllm.v1.worker import gpu_worker

    original = gpu_worker.Worker.execute_model
    hangs = [0]

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        global _fired
        out = original(self, scheduler_output, *args, **kwargs)
        with _lock:
            _state["execute_model_calls"] += 1
            if getattr(scheduler_output, "total_num_scheduled_tokens", 0):
                _state["forward_calls"] += 1
        if kind in ("spin", "block"):
            if getattr(scheduler_output, "total_num_scheduled_tokens", 0) and os.path.exists(fire):
                try:
                    os.unlink(fire)  # one hang per appearance of the file
                except OSError:
                    return out
                hangs[0] += 1
                _hang(fire, kind, hangs[0])
            return out
        if not _fired and getattr(scheduler_output, "total_num_scheduled_tokens", 0) and os.path.exists(fire):
            _fired = True
            if kind == "raise":  # no GPU fault: the script's own smoke run on vLLM's CPU build
                launched = time.time()
                with _lock:
                    _state["drill_launched_at"] = launched
                    _state["drill_step"] = _state["schedule_calls"]
                with open(fire + ".launched", "w") as f:
                    f.write(json.dumps({"ts": launched, "pid": os.getpid(), "kind": kind, "step": _state["drill_step"]}))
                raise RuntimeError("CUDA error: unspecified launch failure")
            import cupy as cp
            import torch

            body = 'asm volatile("trap;");' if kind == "trap" else "*((volatile int*)0x10) = 1;"
            k = cp.RawModule(code='extern "C" __global__ void k(int* p){ ' + body + " }").get_function("k")
            stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
            buf = cp.zeros(1, dtype=cp.int32)
            launched = time.time()
            k((1,), (1,), (buf,), stream=stream)
            with _lock:
                _state["drill_launched_at"] = launched
                _state["drill_step"] = _state["schedule_calls"]
            with open(fire + ".launched", "w") as f:
                f.write(json.dumps({"ts": launched, "pid": os.getpid(), "kind": kind, "step": _state["drill_step"]}))
        return out

    gpu_worker.Worker.execute_model = execute_model


def register() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    directory = os.environ.get("FLIGHTREC_PROBE_DIR")
    if directory:
        os.makedirs(directory, exist_ok=True)
        _count_schedule(directory)
        if os.environ.get("FLIGHTREC_PROBE_RECORDER") == "1":
            _recorder_timings()
        gc.callbacks.append(_gc_timer)
        threading.Thread(target=_writer, args=(directory,), daemon=True, name="gpu-probe").start()
    fire = os.environ.get("FLIGHTREC_DRILL_FIRE")
    if fire:
        _drill(fire, os.environ.get("FLIGHTREC_DRILL_KIND", "trap"))
