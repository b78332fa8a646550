"""Internal: ``StatsRecorder``: one engine step's aggregates, one binary ``S`` record per call.

This is what vLLM's stat-logger plugin (``collector.vllm.plugin``) writes through, and what any
other engine or a load simulator calls to write steps the way vLLM's adapter does::

    rec = StatsRecorder(EngineIdentity(server_pid=os.getpid(), server_port=8000))
    rec.write_fingerprint({"block_size": 64, ...})
    rec.write_step(812, running=4, waiting=7, deferred=2, kv_cache_usage=0.032, preemptions=0,
                   prompt_tokens=300, generation_tokens=4, finished=0,
                   prefix_cache_queries=640, prefix_cache_hits=128,
                   extras={"connector": {...}})

Every fixed field is keyword-only and required: pass None for a value the engine did not give
(the record names it in ``"null"`` and the sidecar stores null, never 0). ``extras`` keys, as
the codec documents them: ``connector`` (per connector, ``collector.vllm.extract``),
``waiting_by_reason`` (beyond capacity/deferred), ``worker``, ``iteration`` (vLLM's iteration
details), ``cudagraph`` (the step's CUDA graph use), ``external_prefix_cache``. A step's finished
requests are the ``finished`` count; each one's end is a workload record
(``collector.recorder.requests``).
"""

from __future__ import annotations

from typing import Any

from collector.channel.wire import encode_step_fields
from collector.recorder.base import RecorderBase
from collector.recorder.channel import STATS_RING_BYTES

__all__ = ["STATS_RING_BYTES", "StatsRecorder"]


class StatsRecorder(RecorderBase):
    """Writes the ``stats`` ring of one engine (the API-server side in vLLM)."""

    role = "stats"

    def __init__(self, *args: Any, capacity: int = STATS_RING_BYTES, **kwargs: Any) -> None:
        super().__init__(*args, capacity=capacity, **kwargs)

    def write_step(
        self,
        step: int,
        *,
        ts: float | None = None,
        running: int | None,
        waiting: int | None,
        deferred: int | None,
        kv_cache_usage: float | None,
        preemptions: int | None,
        prompt_tokens: int | None,
        generation_tokens: int | None,
        finished: int | None,
        prefix_cache_queries: int | None,
        prefix_cache_hits: int | None,
        extras: dict[str, Any] | None = None,
    ) -> None:
        """One step. ``waiting`` counts every waiting request, ``deferred`` (vLLM's skipped
        waiting requests) is the part of it held back by a transient constraint;
        ``kv_cache_usage`` is 0..1; the token and preemption counts are this step's."""
        self._emit(
            "write_step",
            encode_step_fields,
            step,
            self.clock() if ts is None else ts,
            self.identity.engine_index,
            running,
            waiting,
            deferred,
            kv_cache_usage,
            preemptions,
            prompt_tokens,
            generation_tokens,
            finished,
            prefix_cache_queries,
            prefix_cache_hits,
            extras,
        )
