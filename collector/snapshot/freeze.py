"""Freezing the rings into a crash snapshot, which events trigger one, and the triage
checklist a snapshot answers.

Pure functions over the hub's in-memory state and over stored documents: no I/O here. The
hub decides when; this module decides what a snapshot holds and what it says.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from collector.model import Event, EventKind, GpuSample, LogLine, Severity, StepRecord
from collector.redact import redact
from collector.ingest.request_columns import StepColumns
from collector.snapshot.document import REQUEST_COLUMNS, RequestTable, SnapshotDoc

# Events that freeze the ring. An Xid of the "info" class (e.g. a reported ECC correction)
# does not; CRASH_DUMP lines ride along with the fatal error that accompanies them.
TRIGGER_KINDS = frozenset(
    {
        EventKind.XID, EventKind.GPU_LOST, EventKind.CUDA_ERROR, EventKind.NCCL_ERROR,
        EventKind.ENGINE_FATAL, EventKind.ENGINE_DEAD, EventKind.ENGINE_DOWN,
        EventKind.RECORDER_SILENT, EventKind.MANUAL,
    }
)  # fmt: skip
# Events that name a process that failed (a TP worker, the engine core).
FAILURE_KINDS = frozenset({EventKind.CUDA_ERROR, EventKind.NCCL_ERROR, EventKind.ENGINE_FATAL})
TRIGGER_KIND_VALUES = frozenset(k.value for k in TRIGGER_KINDS) | {EventKind.ANOMALY.value}


def is_trigger(ev: Event) -> bool:
    if ev.kind is EventKind.ANOMALY:
        return ev.severity is Severity.CRITICAL
    if ev.kind is EventKind.XID:
        return ev.severity is not Severity.INFO
    return ev.kind in TRIGGER_KINDS


def step_row(rec: StepRecord) -> dict[str, Any]:
    return {
        "step": rec.step, "ts": rec.ts, "running": rec.running, "waiting": rec.waiting,
        "kv_cache_usage": rec.kv_cache_usage, "preemptions": rec.preemptions,
        "prompt_tokens": rec.prompt_tokens, "generation_tokens": rec.generation_tokens,
        "finished": rec.finished, "mirror_rows": rec.mirror_rows,
        "waiting_by_reason": rec.waiting_by_reason, "connector": rec.connector,
        "prefix_cache_queries": rec.prefix_cache_queries, "prefix_cache_hits": rec.prefix_cache_hits,
        "engine_index": rec.engine_index, "has_requests": rec.requests is not None,
    }  # fmt: skip


def request_table(steps: Iterable[StepRecord]) -> RequestTable:
    """The per-request rows of the steps, as columns (no row dicts: 262k of them cost ~1 s)."""
    steps = list(steps)
    chunks = [rec.request_columns for rec in steps if rec.requests]
    if all(isinstance(c, StepColumns) and not c.has_extras and c.n == len(rec.requests or ())
           for c, rec in zip(chunks, [r for r in steps if r.requests], strict=True)):  # fmt: skip
        # the hub built each step's columns on arrival: concatenate them
        return RequestTable.from_chunks(chunks)  # type: ignore[arg-type]
    pairs = [(rec.step, r) for rec in steps for r in rec.requests or ()]
    cols: dict[str, list[Any]] = {"step": [s for s, _ in pairs]}
    for name in REQUEST_COLUMNS[1:]:
        cols[name] = [getattr(r, name) for _, r in pairs]
    sparse = []
    if any(r.extras for _, r in pairs):
        cols["extras"] = [r.extras or None for _, r in pairs]
        sparse.append("extras")
    return RequestTable(cols, sparse)


def request_rows(steps: Iterable[StepRecord]) -> list[dict[str, Any]]:
    return list(request_table(steps))


def _step_at(steps: Sequence[StepRecord], ts: float) -> int | None:
    """The last step recorded at or before ``ts``: the step a failing worker was running."""
    best = None
    for s in steps:
        if s.ts <= ts:
            best = s.step
    return best


def _event_step(ev: Event) -> int | None:
    for key in ("step", "step_counter"):
        value = ev.data.get(key)
        if isinstance(value, int):
            return value
    stats = ev.data.get("stats")
    if isinstance(stats, dict) and isinstance(stats.get("step_counter"), int):
        return int(stats["step_counter"])
    return None


def summarize(steps: Sequence[StepRecord], events: Sequence[Event]) -> dict[str, Any]:
    """The figures an on-call engineer reads first: the state at the last step."""
    out: dict[str, Any] = {"step_count": len(steps)}
    if steps:
        last = steps[-1]
        with_reqs = next((s for s in reversed(steps) if s.requests), None)
        out.update(
            first_step=steps[0].step, last_step=last.step, last_step_ts=last.ts, running=last.running,
            waiting=last.waiting, kv_cache_usage=last.kv_cache_usage,
            preemptions_in_ring=sum(s.preemptions for s in steps),
            max_running_in_ring=max(s.running for s in steps),
            concurrency_at_fault=last.running + last.waiting,
            # the load phase: the most requests the engine held at once in the ring
            peak_concurrency=max(s.running + s.waiting for s in steps),
            mirror_rows=last.mirror_rows,
        )  # fmt: skip
        if with_reqs is not None and with_reqs.requests:
            ctx = [r.computed_tokens for r in with_reqs.requests]
            out["requests_at_last_step"] = {
                "step": with_reqs.step,
                "count": len(ctx),
                "context_len_min": min(ctx),
                "context_len_max": max(ctx),
                "context_len_mean": sum(ctx) / len(ctx),
                "preemptions": sum(r.preemptions for r in with_reqs.requests),
                "mirror_rows": {r.request_id: r.mirror_rows for r in with_reqs.requests},
            }
    dump_step = next((_event_step(e) for e in events if e.kind is EventKind.CRASH_DUMP and _event_step(e)), None)
    failed: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.kind in FAILURE_KINDS and ev.process and ev.process not in failed:
            step = _event_step(ev)
            how = "event"
            if step is None and dump_step is not None:
                step, how = dump_step, "crash_dump"
            if step is None and steps:
                step, how = _step_at(steps, ev.ts), "last_step_before"
            failed[ev.process] = {"ts": ev.ts, "message": redact(ev.message)[:500], "pid": ev.pid, "kind": ev.kind.value,
                                  "step": step, "step_from": how}  # fmt: skip
    if failed:
        out["failed_processes"] = failed
    xids = sorted({ev.xid for ev in events if ev.xid is not None})
    if xids:
        out["xids"] = xids
    return out


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Freezing a full ring allocates ~half a million objects, which sets off full collections
    that walk the whole heap (the ring itself: millions of objects): 3x the freeze's own cost.
    The pause is bounded by the freeze (~100 ms)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def build_snapshot(
    *,
    host: str,
    engine: str,
    trigger: Event,
    steps: Sequence[StepRecord],
    gpu_samples: Sequence[GpuSample],
    events: Sequence[Event],
    log_lines: Sequence[LogLine],
    fingerprint: dict[str, Any],
    extra_summary: dict[str, Any] | None = None,
    created_at: float | None = None,
) -> SnapshotDoc:
    with _gc_paused():
        return _build(host, engine, trigger, steps, gpu_samples, events, log_lines, fingerprint, extra_summary, created_at)


def _build(
    host: str, engine: str, trigger: Event, steps: Sequence[StepRecord], gpu_samples: Sequence[GpuSample],
    events: Sequence[Event], log_lines: Sequence[LogLine], fingerprint: dict[str, Any],
    extra_summary: dict[str, Any] | None, created_at: float | None,
) -> SnapshotDoc:  # fmt: skip
    summary = summarize(steps, events)
    if extra_summary:
        summary.update(extra_summary)
    return SnapshotDoc(
        host=host,
        engine=engine,
        created_at=time.time() if created_at is None else created_at,
        fault_ts=trigger.ts,
        trigger=redact(trigger.to_dict()),
        summary=summary,
        fingerprint=redact(fingerprint),
        steps=[step_row(s) for s in steps],
        requests=request_table(steps),
        gpu_samples=[g.to_dict() for g in gpu_samples],
        events=[redact(e.to_dict()) for e in events],
        log_lines=[{"ts": line.ts, "line": redact(line.line)} for line in log_lines],
    )
