"""The stat-logger plugin: every engine step's ``SchedulerStats`` and ``IterationStats``, into
the recorder ring of its engine.

vLLM loads it through the ``vllm.stat_logger_plugins`` entry point (declared in this package's
metadata, so installing the package is enough) and makes one instance per engine index in the
API-server process. ``record`` runs on vLLM's output path about once per engine step: it packs
one binary record (``collector.channel.codec``, tag ``S``) and copies it into a memory-mapped
ring; nothing else. Any fault disables the recorder and is logged once; vLLM never sees it.

Step numbers: the RecordingScheduler, when used, stamps its own step number into
``SchedulerStats.step_counter`` (which vLLM leaves at 0 outside MoE data parallelism), so the
stats and the per-request rows of one step carry the same number. Without it, the plugin counts
the steps it is given.
"""

from __future__ import annotations

import os
import time
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from collector.channel.codec import encode_step_fields
from collector.vllm._version import vllm_version
from collector.recorder.channel import STATS_RING_BYTES, RecorderChannel, guarded
from collector.vllm.extract import finished_row, flatten_connector


class FlightRecorderStatLogger(StatLoggerBase):
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.version = vllm_version()
        self.channel = RecorderChannel.from_env(
            engine_index=engine_index,
            role="stats",
            vllm_version=self.version,
            server_pid=os.getpid(),
            capacity=STATS_RING_BYTES,
        )
        self._own_step = 0
        self._fp_written = False
        # Iteration figures that came without scheduler stats ride on the next step record.
        self._pending_prompt = 0
        self._pending_gen = 0
        self._pending_preempt = 0
        self._pending_finished: list[Any] = []

    # -- vLLM's interface -------------------------------------------------------------------
    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if self.channel.active:
            guarded(self.channel, "record", self._record, scheduler_stats, iteration_stats)

    def log_engine_initialized(self) -> None:
        if self.channel.active:
            guarded(self.channel, "log_engine_initialized", self._write_fingerprint)

    def log(self) -> None:
        pass

    # -- ours -------------------------------------------------------------------------------
    def _write_fingerprint(self) -> None:
        self.channel.write_fingerprint(self.vllm_config, self.version)
        self._fp_written = True

    def _record(self, s: Any, it: Any) -> None:
        if it is not None:
            self._pending_prompt += getattr(it, "num_prompt_tokens", 0) or 0
            self._pending_gen += getattr(it, "num_generation_tokens", 0) or 0
            self._pending_preempt += getattr(it, "num_preempted_reqs", 0) or 0
            fin = getattr(it, "finished_requests", None)
            if fin:
                self._pending_finished.extend(fin)
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
        extras: dict[str, Any] | None = None
        kvc = getattr(s, "kv_connector_stats", None)
        if kvc:
            extras = {"connector": flatten_connector(kvc)}
        fin = self._pending_finished
        if fin:
            extras = extras or {}
            extras["finished_requests"] = [finished_row(f) for f in fin]
            self._pending_finished = []
        fetch = getattr(s, "num_kv_fetch_reqs_by_stage", None)
        if fetch and any(fetch.values()):
            extras = extras or {}
            extras["waiting_by_reason"] = {f"kv_fetch_{k}": v for k, v in fetch.items()}
        waiting = getattr(s, "num_waiting_reqs", 0) or 0
        deferred = getattr(s, "num_skipped_waiting_reqs", 0) or 0
        pcs = getattr(s, "prefix_cache_stats", None)
        payload = encode_step_fields(
            step,
            time.time(),
            self.engine_index,
            getattr(s, "num_running_reqs", 0) or 0,
            waiting + deferred,
            deferred,
            float(getattr(s, "kv_cache_usage", 0.0) or 0.0),
            self._pending_preempt,
            self._pending_prompt,
            self._pending_gen,
            len(fin),
            getattr(pcs, "queries", 0) or 0,
            getattr(pcs, "hits", 0) or 0,
            extras,
        )
        self._pending_prompt = self._pending_gen = self._pending_preempt = 0
        self.channel.write(payload)
