"""A vLLM scheduler that wedges on demand, for tests and benchmarks of the wedge detector on a real
engine (test support, not shipped in the package).

``--scheduler-cls wedge_scheduler.WedgeScheduler`` (this folder on the engine's PYTHONPATH): the
recorder's ``RecordingScheduler`` over whichever scheduler vLLM would pick, whose ``schedule()``
blocks inside ``hold_while_wedged`` for as long as the file named by ``FLIGHTREC_WEDGE_FILE``
exists. Every request it holds stays running, none waits, and the recorder's rings stop moving:
the engine core is stuck inside its step, as one waiting on a collective or a spinning kernel is,
while vLLM's ``/health`` keeps answering 200. Without the variable, or without the file, it is
the recording scheduler and nothing else.
"""

from __future__ import annotations

import os
import time
from typing import Any

from collector.vllm.scheduler import RecordingScheduler, recording_class, scheduler_vllm_would_choose

_CLASSES: dict[type, type] = {}


def hold_while_wedged(path: str) -> float:
    """The blocking frame a wedge's stacks must show: sleeps while ``path`` exists; returns how
    long it held the step."""
    started = time.monotonic()
    while True:
        try:
            os.stat(path)  # C, no Python frame above this one: this function is the innermost
        except FileNotFoundError:
            return time.monotonic() - started
        time.sleep(0.05)


class WedgeScheduler(RecordingScheduler):
    def __new__(cls, *args: Any, **kwargs: Any) -> WedgeScheduler:
        if cls is WedgeScheduler:  # over the recording class of the scheduler vLLM would choose
            recording = recording_class(scheduler_vllm_would_choose(kwargs.get("vllm_config", args[0] if args else None)))
            cls = _CLASSES.get(recording) or _CLASSES.setdefault(
                recording, type(f"Wedge{recording.__name__}", (WedgeScheduler, recording), {"__module__": __name__})
            )
        return object.__new__(cls)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        path = os.environ.get("FLIGHTREC_WEDGE_FILE")
        if path and os.path.exists(path):
            hold_while_wedged(path)
        return super().schedule(*args, **kwargs)
