"""Freezing the rings into a crash snapshot, and which events trigger one.

Pure functions over the hub's in-memory state: no I/O here. The hub decides when; this
module decides what a snapshot holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from collector.model import Event, EventKind, GpuSample, LogLine, Severity, StepRecord
from collector.redact import redact
from collector.snapshot_doc import SnapshotDoc

# Events that freeze the ring. An Xid of the "info" class (e.g. a reported ECC correction)
# does not; CRASH_DUMP lines ride along with the fatal error that accompanies them.
TRIGGER_KINDS = frozenset(
    {
        EventKind.XID, EventKind.GPU_LOST, EventKind.CUDA_ERROR, EventKind.NCCL_ERROR,
        EventKind.ENGINE_FATAL, EventKind.ENGINE_DEAD, EventKind.ENGINE_DOWN,
        EventKind.RECORDER_SILENT, EventKind.MANUAL,
    }
)  # fmt: skip


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


def request_rows(steps: Iterable[StepRecord]) -> list[dict[str, Any]]:
    out = []
    for rec in steps:
        for r in rec.requests or ():
            row = {
                "step": rec.step, "request_id": r.request_id, "prompt_len": r.prompt_len,
                "computed_tokens": r.computed_tokens, "output_tokens": r.output_tokens,
                "preemptions": r.preemptions, "status": r.status, "mirror_rows": r.mirror_rows,
            }  # fmt: skip
            if r.extras:
                row["extras"] = r.extras
            out.append(row)
    return out


def summarize(steps: Sequence[StepRecord], events: Sequence[Event]) -> dict[str, Any]:
    """The figures an on-call engineer reads first: the state at the last step."""
    out: dict[str, Any] = {"step_count": len(steps)}
    if steps:
        last = steps[-1]
        with_reqs = next((s for s in reversed(steps) if s.requests), None)
        out.update(
            last_step=last.step, last_step_ts=last.ts, running=last.running, waiting=last.waiting,
            kv_cache_usage=last.kv_cache_usage,
            preemptions_in_ring=sum(s.preemptions for s in steps),
            max_running_in_ring=max(s.running for s in steps),
            concurrency_at_fault=last.running + last.waiting,
            mirror_rows=last.mirror_rows,
        )  # fmt: skip
        if with_reqs is not None and with_reqs.requests:
            ctx = [r.computed_tokens for r in with_reqs.requests]
            out["requests_at_last_step"] = {
                "step": with_reqs.step,
                "count": len(ctx),
                "context_len_max": max(ctx),
                "context_len_mean": sum(ctx) / len(ctx),
                "mirror_rows": {r.request_id: r.mirror_rows for r in with_reqs.requests},
            }
    failed = {}
    for ev in events:
        if ev.kind in (EventKind.CUDA_ERROR, EventKind.NCCL_ERROR, EventKind.ENGINE_FATAL) and ev.process:
            failed.setdefault(ev.process, {"ts": ev.ts, "message": ev.message, "pid": ev.pid,
                                           "step": ev.data.get("step")})  # fmt: skip
    if failed:
        out["failed_processes"] = failed
    xids = sorted({ev.xid for ev in events if ev.xid is not None})
    if xids:
        out["xids"] = xids
    return out


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
        requests=request_rows(steps),
        gpu_samples=[g.to_dict() for g in gpu_samples],
        events=[redact(e.to_dict()) for e in events],
        log_lines=[{"ts": line.ts, "line": redact(line.line)} for line in log_lines],
    )
