"""``RecordingScheduler``: the scheduler vLLM would have chosen, plus each running request's
state every step and one workload record when a request arrives and when it ends.

Opt in with ``--scheduler-cls collector.vllm.RecordingScheduler``. vLLM then constructs this
class instead of its own choice (``SchedulerConfig.get_scheduler_cls``), and would lose
``AsyncScheduler``, its default on GPUs (``vllm/config/scheduler.py``: "If you have subclassed
Scheduler instead of AsyncScheduler, you will see degraded performance"). So ``__new__`` reads
the config it is given and builds the recording subclass of what vLLM would have picked:
``RecordingAsyncScheduler`` (on ``AsyncScheduler``) when ``scheduler_config.async_scheduling``
is on, the diffusion schedulers when a diffusion config is set, else this class on
``Scheduler``. vLLM has settled ``async_scheduling`` before the engine core builds its
scheduler (``VllmConfig.__post_init__``; the CPU platform hook turns it off).

It runs in the engine-core process, the only place per-request state lives. After each
``schedule()`` it writes one ``R`` record (``collector.recorder.RequestRecorder``) of the running
requests: id, prompt length, computed tokens (this step's included), output tokens,
preemptions, status, and with a HiSparse connector the rows it mirrors this step and the host
blocks it holds (``collector.vllm.hisparse``).

It also numbers the steps: the n-th ``schedule()`` is step n, and the ``SchedulerStats`` made
for that step's output get ``step_counter = n`` (vLLM leaves the field at 0 outside MoE data
parallelism; a non-zero value set by vLLM is left alone), so the stat logger in the API server
writes the same number. With async scheduling the output of step n is processed after step n+1
was scheduled: the step is found through the ``SchedulerOutput`` being processed.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from collector.recorder import RequestRecorder
from collector.recorder.channel import guarded, log
from collector.vllm._version import gate, vllm_version
from collector.vllm.extract import RequestColumns
from collector.vllm.fingerprint import fingerprint_facts
from collector.vllm.hisparse import HostBlocks, MirrorRows, find_hisparse
from collector.vllm.server import server_identity

__all__ = ["RecordingAsyncScheduler", "RecordingScheduler", "finish_name", "recording_class", "scheduler_vllm_would_choose"]

_MAX_IN_FLIGHT = 64  # scheduled outputs awaiting update_from_output; vLLM keeps a few at most
_MAX_CACHED = 65536  # requests scheduled and not ended yet whose prefix-cache hits are held
# vLLM's finished statuses, as the workload record's ``finish`` names them.
_FINISH = {"length_capped": "length"}


def _engine_index(vllm_config: Any) -> int:
    pc = getattr(vllm_config, "parallel_config", None)
    for name in ("data_parallel_index", "data_parallel_rank"):
        value = getattr(pc, name, None)
        if isinstance(value, int):
            return value
    return 0


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def finish_name(status: Any) -> str:
    name = str(getattr(status, "name", status)).lower()
    name = name.removeprefix("finished_")
    return _FINISH.get(name, name)


class _SchedRecorder:
    """The scheduler's side of the recorder: vLLM's objects in, ``RequestRecorder`` calls out."""

    def __init__(self, vllm_config: Any, *, connector: Any = None, base: type | None = None, version: str | None = None) -> None:
        version = vllm_version() if version is None else version
        self.recorder = RequestRecorder(server_identity(vllm_config, _engine_index(vllm_config), version, in_engine_core=True))
        self.channel = self.recorder.channel
        self.engine_index = self.recorder.identity.engine_index
        self.columns = RequestColumns()
        self.hisparse = find_hisparse(connector)
        self.host_blocks = HostBlocks(self.hisparse) if self.hisparse is not None else None
        self.mirror_rows = MirrorRows()
        self.step = 0
        self.current = 0
        self.in_flight: dict[int, int] = {}
        # request id -> tokens it found computed when first scheduled (prefix cache, local or
        # through the connector): vLLM 0.32's Request keeps no such figure to its end
        self.cached: dict[str, int] = {}
        if self.channel.active:
            guarded(self.channel, "fingerprint", self._fingerprint, vllm_config, base)

    def _fingerprint(self, vllm_config: Any, base: type | None) -> None:
        facts = fingerprint_facts(vllm_config, self.recorder.identity)
        facts["scheduler_base"] = _qualname(base) if base is not None else None
        self.recorder.write_fingerprint(facts)

    def scheduled(self, running: Any, output: Any) -> None:
        self.step += 1
        self.current = self.step
        flight = self.in_flight
        if len(flight) >= _MAX_IN_FLIGHT:
            flight.clear()
        flight[id(output)] = self.step
        new = getattr(output, "scheduled_new_reqs", None)
        if new:  # a few a step: their computed tokens at first scheduling are the cache hits
            cached = self.cached
            for nr in new:
                cached.setdefault(nr.req_id, nr.num_computed_tokens)
            while len(cached) > _MAX_CACHED:
                del cached[next(iter(cached))]
        cols = self.columns
        counts = cols.counts(running, changed=bool(getattr(output, "preempted_req_ids", None)))
        mirror = host = None
        if self.host_blocks is not None:
            ids = cols.id_list
            mirror_rows = self.mirror_rows
            mirror = mirror_rows.column(ids, mirror_rows.rows_of(getattr(output, "kv_connector_metadata", None)))
            host = self.host_blocks.column(ids)
        self.recorder.write_encoded(self.step, time.time(), len(running), cols.ids, cols.prompt, counts, b"", cols.preempt, cols.status, mirror, host)

    def updating(self, output: Any) -> None:
        self.current = self.in_flight.pop(id(output), self.current)

    def stamp(self, stats: Any) -> None:
        if getattr(stats, "step_counter", 0) == 0 and self.current:
            stats.step_counter = self.current

    def arrived(self, request: Any) -> None:
        params = getattr(request, "sampling_params", None)
        self.recorder.write_arrival(
            str(request.request_id),
            ts=float(getattr(request, "arrival_time", None) or time.time()),
            prompt_len=int(request.num_prompt_tokens),
            max_tokens=getattr(params, "max_tokens", None),
            n=getattr(params, "n", None),
            ignore_eos=getattr(params, "ignore_eos", None),
            has_stop=None if params is None else bool(getattr(params, "stop", None) or getattr(params, "stop_token_ids", None)),
        )

    def ended(self, request: Any) -> None:
        rid = str(request.request_id)
        at_start = self.cached.pop(rid, None)  # None: never scheduled (aborted while waiting)
        cached = getattr(request, "num_cached_tokens", None)  # a later vLLM's own figure, when set
        self.recorder.write_end(
            rid,
            output_len=getattr(request, "num_output_tokens", None),
            finish=finish_name(getattr(request, "status", "unknown")),
            cached_tokens=cached if isinstance(cached, int) and cached >= 0 else at_start,
        )


def scheduler_vllm_would_choose(vllm_config: Any) -> type:
    """The class ``SchedulerConfig.get_scheduler_cls`` returns with no ``scheduler_cls`` set."""
    sched = getattr(vllm_config, "scheduler_config", None)
    is_async = bool(getattr(sched, "async_scheduling", False))
    if getattr(vllm_config, "diffusion_config", None) is not None:
        try:
            from vllm.v1.core.sched import diffusion_scheduler  # noqa: PLC0415 - rare, and vLLM's own
        except ImportError:  # vLLM 0.26 has the config but no diffusion scheduler: it picks the usual ones
            pass
        else:
            return diffusion_scheduler.DiffusionAsyncScheduler if is_async else diffusion_scheduler.DiffusionScheduler
    return AsyncScheduler if is_async else Scheduler


class RecordingScheduler(Scheduler):
    def __new__(cls, *args: Any, **kwargs: Any) -> RecordingScheduler:
        if cls is RecordingScheduler:
            cls = recording_class(scheduler_vllm_would_choose(kwargs.get("vllm_config", args[0] if args else None)))
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flightrec: _SchedRecorder | None = None
        try:
            version = vllm_version()
            if not gate(version):  # off under a vLLM it does not support, said once
                return
            base = next(c for c in type(self).__mro__ if not issubclass(c, RecordingScheduler))
            self._flightrec = _SchedRecorder(self.vllm_config, connector=getattr(self, "connector", None), base=base, version=version)
        except Exception as exc:  # noqa: BLE001 - never stop the engine from starting
            log.warning("flight recorder (sched) disabled: %r", exc)

    def add_request(self, request: Any) -> None:
        rec = self._flightrec
        new = rec is not None and rec.channel.active and request.request_id not in self.requests
        super().add_request(request)
        if new and rec is not None:
            guarded(rec.channel, "add_request", rec.arrived, request)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM frees every request that ends here (stopped, length, aborted, error).
        rec = self._flightrec
        if rec is not None and rec.channel.active:
            guarded(rec.channel, "_free_request", rec.ended, request)
        return super()._free_request(request, *args, **kwargs)

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


class RecordingAsyncScheduler(RecordingScheduler, AsyncScheduler):
    """The recorder on vLLM's ``AsyncScheduler``: what ``RecordingScheduler`` becomes when async
    scheduling is on. The method order is this recorder's, then AsyncScheduler's, then
    Scheduler's, so every ``super()`` call above runs AsyncScheduler's code."""


_CLASSES: dict[type, type] = {Scheduler: RecordingScheduler, AsyncScheduler: RecordingAsyncScheduler}


def recording_class(base: type) -> type:
    """The recording subclass of ``base`` (built once for a base not named above)."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(f"Recording{base.__name__}", (RecordingScheduler, base), {"__module__": __name__})
        globals()[cls.__name__] = cls
        _CLASSES[base] = cls
    return cls
