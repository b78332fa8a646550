"""The stat-logger plugin: every engine step's ``SchedulerStats`` and ``IterationStats``, into
the recorder ring of its engine, through ``collector.recorder.StatsRecorder``.

vLLM loads it through the ``vllm.stat_logger_plugins`` entry point (declared in this package's
metadata, so installing the package is enough) and makes one instance per engine index in the
API-server process. ``record`` runs on vLLM's output path about once per engine step: it reads
the stats (``collector.vllm.extract``) and writes one binary record; nothing else. Any fault
disables the recorder and is logged once; vLLM never sees it. Under a vLLM outside the supported
versions (``collector.vllm._version``) it records nothing and says so in one log line.

Step numbers: the RecordingScheduler, when used, stamps its own step number into
``SchedulerStats.step_counter`` (which vLLM leaves at 0 outside MoE data parallelism), so the
stats and the per-request rows of one step carry the same number. Without it, the plugin counts
the steps it is given.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from collector.recorder import StatsRecorder
from collector.recorder.channel import RecorderChannel, guarded, log
from collector.vllm._version import gate, vllm_version
from collector.vllm.extract import step_extras
from collector.vllm.fingerprint import fingerprint_facts
from collector.vllm.server import server_identity

__all__ = ["FlightRecorderStatLogger"]


class FlightRecorderStatLogger(StatLoggerBase):
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.version = vllm_version()
        self.recorder: StatsRecorder | None = None
        self.channel: RecorderChannel | None = None
        try:
            if gate(self.version):
                self.recorder = StatsRecorder(server_identity(vllm_config, engine_index, self.version, in_engine_core=False))
                self.channel = self.recorder.channel
        except Exception as exc:  # noqa: BLE001 - never stop the engine from starting
            log.warning("flight recorder (stats) disabled: %r", exc)
        kvt = getattr(vllm_config, "kv_transfer_config", None)
        self.connector = getattr(kvt, "kv_connector", None)  # names a single connector's stats
        self._own_step = 0
        self._fp_written = False
        # Iteration figures that came without scheduler stats ride on the next step record.
        self._pending_prompt = 0
        self._pending_gen = 0
        self._pending_preempt = 0
        # finished requests since the last step: counted, not listed (each request's end and
        # output length reach the sidecar once, through the scheduler's workload record)
        self._pending_finished = 0

    # -- vLLM's interface -------------------------------------------------------------------
    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        channel = self.channel
        if channel is not None and channel.active:
            guarded(channel, "record", self._record, scheduler_stats, iteration_stats)

    def log_engine_initialized(self) -> None:
        channel = self.channel
        if channel is not None and channel.active:
            guarded(channel, "log_engine_initialized", self._write_fingerprint)

    def log(self) -> None:
        pass

    # -- ours -------------------------------------------------------------------------------
    def _write_fingerprint(self) -> None:
        assert self.recorder is not None  # called only while the channel is active
        self.recorder.write_fingerprint(fingerprint_facts(self.vllm_config, self.recorder.identity))
        self._fp_written = True

    def _record(self, s: Any, it: Any) -> None:
        if it is not None:
            # IterationStats exists only for a batch with outputs: no object means no tokens,
            # a true 0. A field missing from a present object is unknown (None).
            self._pending_prompt += getattr(it, "num_prompt_tokens", 0) or 0
            self._pending_gen += getattr(it, "num_generation_tokens", 0) or 0
            self._pending_preempt += getattr(it, "num_preempted_reqs", 0) or 0
            fin = getattr(it, "finished_requests", None)
            if fin:
                self._pending_finished += len(fin)
        if s is None:
            return
        if not self._fp_written:
            self._write_fingerprint()
        step = getattr(s, "step_counter", 0) or 0
        if step <= 0:
            self._own_step += 1
            step = self._own_step
        else:
            self._own_step = step
        fin = self._pending_finished
        extras = step_extras(s, connector=self.connector)
        self._pending_finished = 0
        waiting = getattr(s, "num_waiting_reqs", None)
        deferred = getattr(s, "num_skipped_waiting_reqs", None)
        pcs = getattr(s, "prefix_cache_stats", None)
        assert self.recorder is not None
        self.recorder.write_step(
            step,
            ts=time.time(),
            running=getattr(s, "num_running_reqs", None),
            # vLLM's num_waiting_reqs leaves the deferred ones out; ours counts every waiting one
            waiting=None if waiting is None else waiting + (deferred or 0),
            deferred=deferred,
            kv_cache_usage=getattr(s, "kv_cache_usage", None),
            preemptions=self._pending_preempt,
            prompt_tokens=self._pending_prompt,
            generation_tokens=self._pending_gen,
            finished=fin,
            prefix_cache_queries=getattr(pcs, "queries", None),
            prefix_cache_hits=getattr(pcs, "hits", None),
            extras=extras,
        )
        self._pending_prompt = self._pending_gen = self._pending_preempt = 0
