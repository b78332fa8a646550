"""``RecordingScheduler``: vLLM's scheduler, plus each running request's state every step.

Opt in with ``--scheduler-cls collector.vllm.RecordingScheduler``. It runs in the engine-core
process, the only place per-request state lives. After each ``schedule()`` it writes one ``R``
record (``collector.channel.codec``) of the running requests: id, prompt length, computed
tokens (this step's included), output tokens, preemptions, status, and host-mirror rows where
the request carries them (``collector.vllm.extract``).

It also numbers the steps: the n-th ``schedule()`` is step n, and the ``SchedulerStats`` made
for that step's output get ``step_counter = n`` (vLLM leaves the field at 0 outside MoE data
parallelism; a non-zero value set by vLLM is left alone), so the stat logger in the API server
writes the same number. With async scheduling the output of step n may be processed after step
n+1 was scheduled: the step is found through the ``SchedulerOutput`` being processed.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from collector.recorder import RequestRecorder
from collector.recorder.channel import guarded, log
from collector.vllm._version import vllm_version
from collector.vllm.extract import RequestColumns
from collector.vllm.fingerprint import fingerprint_facts
from collector.vllm.server import server_identity

_MAX_IN_FLIGHT = 64  # scheduled outputs awaiting update_from_output; vLLM keeps a few at most


def _engine_index(vllm_config: Any) -> int:
    pc = getattr(vllm_config, "parallel_config", None)
    for name in ("data_parallel_index", "data_parallel_rank"):
        value = getattr(pc, name, None)
        if isinstance(value, int):
            return value
    return 0


class _SchedRecorder:
    """The scheduler's side of the recorder: vLLM's objects in, ``RequestRecorder`` calls out."""

    def __init__(self, vllm_config: Any) -> None:
        version = vllm_version()
        self.recorder = RequestRecorder(
            server_identity(vllm_config, _engine_index(vllm_config), version, in_engine_core=True)
        )
        self.channel = self.recorder.channel
        self.engine_index = self.recorder.identity.engine_index
        self.columns = RequestColumns()
        self.step = 0
        self.current = 0
        self.in_flight: dict[int, int] = {}
        if self.channel.active:
            guarded(self.channel, "fingerprint", self._fingerprint, vllm_config)

    def _fingerprint(self, vllm_config: Any) -> None:
        self.recorder.write_fingerprint(fingerprint_facts(vllm_config, self.recorder.identity))

    def scheduled(self, running: Any, output: Any) -> None:
        self.step += 1
        self.current = self.step
        flight = self.in_flight
        if len(flight) >= _MAX_IN_FLIGHT:
            flight.clear()
        flight[id(output)] = self.step
        cols = self.columns
        computed, out = cols.read(running, changed=bool(getattr(output, "preempted_req_ids", None)))
        self.recorder.write_requests(
            self.step, ts=time.time(), n=len(running), ids=cols.ids, prompt_len=cols.prompt,
            computed=computed, output=out, preemptions=cols.preempt, status=cols.status,
        )  # fmt: skip

    def updating(self, output: Any) -> None:
        self.current = self.in_flight.pop(id(output), self.current)

    def stamp(self, stats: Any) -> None:
        if getattr(stats, "step_counter", 0) == 0 and self.current:
            stats.step_counter = self.current


class RecordingScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flightrec: _SchedRecorder | None = None
        try:
            self._flightrec = _SchedRecorder(self.vllm_config)
        except Exception as exc:  # noqa: BLE001 - never stop the engine from starting
            log.warning("flight recorder (sched) disabled: %r", exc)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)
        rec = self._flightrec
        if rec is not None and rec.channel.active:
            guarded(rec.channel, "schedule", rec.scheduled, self.running, output)
        return output

    def update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        rec = self._flightrec
        if rec is not None and rec.channel.active:
            guarded(rec.channel, "update_from_output", rec.updating, scheduler_output)
        return super().update_from_output(scheduler_output, *args, **kwargs)

    def make_stats(self, *args: Any, **kwargs: Any) -> Any:
        stats = super().make_stats(*args, **kwargs)
        rec = self._flightrec
        if stats is not None and rec is not None and rec.channel.active:
            guarded(rec.channel, "make_stats", rec.stamp, stats)
        return stats
