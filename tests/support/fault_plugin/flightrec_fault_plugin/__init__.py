"""A vLLM general plugin that injects a worker fault, for tests of the crash path.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes (API server,
engine core, workers). ``register()`` does nothing unless ``FLIGHTREC_FAULT_AFTER_STEPS`` is
set, so installing this package into a vLLM environment is harmless otherwise.

Environment:
- ``FLIGHTREC_FAULT_AFTER_STEPS=N``: the worker's ``execute_model`` raises on the first call
  after N calls that scheduled at least one token (an idle engine never faults).
- ``FLIGHTREC_FAULT_MESSAGE``: the error text (default ``CUDA error: unspecified launch
  failure``, the error of the incident this project was built for).
- ``FLIGHTREC_FAULT_MIN_BATCH=R``: only steps that schedule at least R requests count, so the
  fault comes at a point of the load (N steps at concurrency R or more), not at a step number:
  a replay of the same load meets it at the same point.
- ``FLIGHTREC_FAULT_STEP_MIN_MS=T``: a step that schedules tokens takes at least T ms, as a
  GPU's decode step of a real model does (10-30 ms); the tiny test model's CPU steps take 2-3 ms,
  as short as the API server's handling of one request, so which requests share a step would
  depend on how busy the machine is rather than on the load.
- ``FLIGHTREC_FAULT_RANK``: only this TP rank raises (default: every rank).
- ``FLIGHTREC_FAULT_KIND``: ``raise`` (default) or ``exit``: ``os._exit(FLIGHTREC_FAULT_EXIT_CODE
  or 1)`` instead of raising, to imitate a worker process that dies without a traceback.

A worker's wedge, apart from the fault (either may be set without the other):

- ``FLIGHTREC_WEDGE_WORKER_FILE=PATH``: while PATH exists, a worker's ``execute_model`` blocks
  in ``hold_worker_while_wedged`` before it runs the model: one TP rank stuck while the others
  wait for it inside the forward's first collective, as behind a hung kernel or a lost NCCL peer.
- ``FLIGHTREC_WEDGE_RANK``: only this TP rank blocks (default: every rank).
"""

from __future__ import annotations

import os
import time
from typing import Any

DEFAULT_MESSAGE = "CUDA error: unspecified launch failure"
_patched = False


def _scheduled_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    output = kwargs.get("scheduler_output", args[0] if args else None)
    return int(getattr(output, "total_num_scheduled_tokens", 0) or 0)


def _scheduled_requests(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    output = kwargs.get("scheduler_output", args[0] if args else None)
    return len(getattr(output, "num_scheduled_tokens", None) or {})


def hold_worker_while_wedged(path: str) -> None:
    """The stuck worker's blocking frame: sleeps while ``path`` exists (``os.stat`` is C, so no
    Python frame sits above this one)."""
    while True:
        try:
            os.stat(path)
        except FileNotFoundError:
            return
        time.sleep(0.05)


def _register_wedge() -> None:
    path = os.environ.get("FLIGHTREC_WEDGE_WORKER_FILE")
    if not path:
        return
    only_rank = os.environ.get("FLIGHTREC_WEDGE_RANK")
    from vllm.v1.worker import gpu_worker

    original = gpu_worker.Worker.execute_model

    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(path) and (only_rank is None or str(getattr(self, "rank", None)) == only_rank):
            hold_worker_while_wedged(path)
        return original(self, *args, **kwargs)

    gpu_worker.Worker.execute_model = execute_model  # type: ignore[method-assign]


def register() -> None:
    global _patched
    if _patched:
        return
    _register_wedge()
    after = os.environ.get("FLIGHTREC_FAULT_AFTER_STEPS")
    if not after:
        _patched = True
        return
    limit = int(after)
    message = os.environ.get("FLIGHTREC_FAULT_MESSAGE", DEFAULT_MESSAGE)
    only_rank = os.environ.get("FLIGHTREC_FAULT_RANK")
    min_batch = int(os.environ.get("FLIGHTREC_FAULT_MIN_BATCH", "1"))
    kind = os.environ.get("FLIGHTREC_FAULT_KIND", "raise")
    exit_code = int(os.environ.get("FLIGHTREC_FAULT_EXIT_CODE", "1"))
    step_min_s = float(os.environ.get("FLIGHTREC_FAULT_STEP_MIN_MS", "0")) / 1000.0

    # Imported here: the API-server process must not pay for the worker import unless asked.
    from vllm.v1.worker import gpu_worker

    original = gpu_worker.Worker.execute_model
    steps = {"n": 0}

    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return _counted(self, *args, **kwargs)
        finally:
            if step_min_s and _scheduled_tokens(args, kwargs) > 0:
                time.sleep(max(step_min_s - (time.monotonic() - started), 0.0))

    def _counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _scheduled_tokens(args, kwargs) > 0 and _scheduled_requests(args, kwargs) >= min_batch:
            steps["n"] += 1
            rank = getattr(self, "rank", None)
            if steps["n"] > limit and (only_rank is None or str(rank) == only_rank):
                if kind == "exit":
                    os._exit(exit_code)
                raise RuntimeError(message)
        return original(self, *args, **kwargs)

    gpu_worker.Worker.execute_model = execute_model  # type: ignore[method-assign]
    _patched = True
