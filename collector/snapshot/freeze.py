"""Freezing the rings into a crash snapshot, which events trigger one, and the triage
checklist a snapshot answers.

Pure functions over ingest's read-only view and over stored documents: no I/O here. The
trigger policy (``collector.snapshot.policy``) decides when; this module decides what a
snapshot holds and what it says.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from collector.channel.blocks import RequestBlock
from collector.ingest.view import IngestView
from collector.model import CRASH_KINDS, HALF_STATS, Event, EventKind, GpuSample, LogLine, MetricsScrape, Severity, StepRecord
from collector.redact import redact
from collector.snapshot.document import RequestTable, SnapshotDoc

# Events that freeze the ring. An Xid of the "info" class (e.g. a reported ECC correction)
# does not; CRASH_DUMP lines ride along with the fatal error that accompanies them.
TRIGGER_KINDS = frozenset(
    {
        EventKind.XID,
        EventKind.GPU_LOST,
        EventKind.CUDA_ERROR,
        EventKind.NCCL_ERROR,
        EventKind.ENGINE_FATAL,
        EventKind.ENGINE_DEAD,
        EventKind.ENGINE_DOWN,
        EventKind.RECORDER_SILENT,
        EventKind.ENGINE_WEDGED,
        EventKind.MANUAL,
    }
)
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
    """A step as the export's ``steps`` part holds it: unknown figures are null."""
    return {
        "step": rec.step,
        "ts": rec.ts,
        "running": rec.running,
        "waiting": rec.waiting,
        "kv_cache_usage": rec.kv_cache_usage,
        "preemptions": rec.preemptions,
        "prompt_tokens": rec.prompt_tokens,
        "generation_tokens": rec.generation_tokens,
        "finished": rec.finished,
        "mirror_rows": rec.mirror_rows,
        "host_blocks": rec.host_blocks,
        "waiting_by_reason": rec.waiting_by_reason,
        "connector": rec.connector,
        "prefix_cache_queries": rec.prefix_cache_queries,
        "prefix_cache_hits": rec.prefix_cache_hits,
        "engine_index": rec.engine_index,
        "has_requests": rec.request_block is not None,
        "has_stats": bool(rec.halves & HALF_STATS),
        "requests": rec.request_count,
        "details": rec.details or None,
    }


def request_table(steps: Iterable[StepRecord]) -> RequestTable:
    """The per-request rows of the steps: the recorder's blocks, decoded only when read."""
    return RequestTable.from_blocks([rec.request_block for rec in steps if rec.request_block is not None])


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


LAST_KNOWN = ("running", "waiting", "kv_cache_usage", "mirror_rows", "host_blocks")


def _last_known(steps: Sequence[StepRecord], name: str) -> tuple[Any, int | None]:
    for s in reversed(steps):
        value = getattr(s, name)
        if value is not None:
            return value, s.step
    return None, None


def _max(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def summarize(steps: Sequence[StepRecord], events: Sequence[Event]) -> dict[str, Any]:
    """The figures an on-call engineer reads first: the state at the fault. Each figure is the
    last value the recorder saw, with the step it is from (``at_step``); null when never seen."""
    out: dict[str, Any] = {"step_count": len(steps)}
    if steps:
        last = steps[-1]
        known: dict[str, Any] = {}
        at: dict[str, int | None] = {}
        for name in LAST_KNOWN:
            known[name], at[name] = _last_known(steps, name)
        preempt = [s.preemptions for s in steps if s.preemptions is not None]
        both = [s.running + s.waiting for s in steps if s.running is not None and s.waiting is not None]
        out.update(
            first_step=steps[0].step,
            last_step=last.step,
            last_step_ts=last.ts,
            running=known["running"],
            waiting=known["waiting"],
            kv_cache_usage=known["kv_cache_usage"],
            mirror_rows=known["mirror_rows"],
            host_blocks=known["host_blocks"],
            at_step=at,
            preemptions_in_ring=sum(preempt) if preempt else None,
            max_running_in_ring=_max(s.running for s in steps),
            concurrency_at_fault=(known["running"] + known["waiting"] if known["running"] is not None and known["waiting"] is not None else None),
            # the load phase: the most requests the engine held at once in the ring
            peak_concurrency=max(both) if both else None,
            steps_with_stats=sum(1 for s in steps if s.halves & HALF_STATS),
            steps_with_requests=sum(1 for s in steps if s.request_block is not None),
        )
        graph = next((s for s in reversed(steps) if isinstance(s.details.get("cudagraph"), dict)), None)
        if graph is not None:  # --cudagraph-metrics: the graph the engine's last recorded step ran
            g = graph.details["cudagraph"]
            out["cudagraph_at_last_step"] = {
                "step": graph.step,
                "runtime_mode": g.get("runtime_mode"),
                "num_padded_tokens": g.get("num_padded_tokens"),
                "num_unpadded_tokens": g.get("num_unpadded_tokens"),
            }
        with_reqs = next(
            (
                (s.step, s.request_block)
                for s in reversed(steps)
                if s.request_block is not None and s.request_block.n and not getattr(s.request_block, "gone", False)
            ),
            None,
        )
        if with_reqs is not None:
            at_step, block = with_reqs
            cols = block.column  # decodes this one block only
            ctx = cols("computed_tokens")
            mirror = cols("mirror_rows")
            out["requests_at_last_step"] = {
                "step": at_step,
                "count": len(ctx),
                "context_len_min": min(ctx),
                "context_len_max": max(ctx),
                "context_len_mean": sum(ctx) / len(ctx),
                "preemptions": sum(cols("preemptions")),
                "mirror_rows": dict(zip(cols("request_id"), mirror, strict=True)),
                "host_blocks": dict(zip(cols("request_id"), cols("host_blocks"), strict=True)),
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
            failed[ev.process] = {
                "ts": ev.ts,
                "message": redact(ev.message)[:500],
                "pid": ev.pid,
                "kind": ev.kind.value,
                "step": step,
                "step_from": how,
            }
    if failed:
        out["failed_processes"] = failed
    xids = sorted({ev.xid for ev in events if ev.xid is not None})
    if xids:
        out["xids"] = xids
    return out


def own_copy(ev: Event) -> Event:
    """An event the build may read in its worker thread, as its own copy. Ingest changes no
    event it filed (a later witness of an Xid is merged into a new event, ``XidMerger``), but
    ``to_dict`` walks ``data`` in Python, and a key added meanwhile by anyone sharing it would
    end the build with "dictionary changed size during iteration" (``tests/snapshot/test_commit_race.py``)."""
    return replace(ev, data=copy.deepcopy(ev.data), frames=list(ev.frames), lines=list(ev.lines), sources=list(ev.sources))


@dataclass
class Capture:
    """What a snapshot is made of, taken on the event loop: references, copied lists, nothing
    decoded or encoded (milliseconds at any load); the events are copies (``own_copy``).
    ``build`` makes the document, off the loop."""

    host: str
    engine: str
    trigger: Event
    steps: Sequence[StepRecord]  # built when the capture is (ingest.window.HeldSteps)
    gpu_samples: list[GpuSample]
    events: list[Event]
    log_lines: list[LogLine]
    fingerprint: dict[str, Any]
    extra: dict[str, Any]
    scrapes: list[MetricsScrape]
    workload: Any  # WorkloadLog export, made on the loop (bounded: at most its max_requests)
    stacks: dict[str, Any] | None = None  # a wedge's stacks part (collector.stacks.part), else None

    def build(self) -> SnapshotDoc:
        doc = build_snapshot(
            host=self.host,
            engine=self.engine,
            trigger=self.trigger,
            steps=self.steps,
            gpu_samples=self.gpu_samples,
            events=self.events,
            log_lines=self.log_lines,
            fingerprint=self.fingerprint,
            extra_summary=self.extra,
        )
        doc.scrapes = [{"ts": s.ts, "values": s.values, "rates": s.rates} for s in self.scrapes]
        doc.workload = self.workload
        doc.stacks = self.stacks
        return doc


SCRAPE_SECONDS = 300.0  # the scrapes a snapshot holds: the last five minutes before its trigger


def capture(
    view: IngestView,
    engine: str,
    trigger: Event,
    *,
    gpu_seconds: float,
    scrape_seconds: float = SCRAPE_SECONDS,
    scrape_interval: float | None = None,
) -> Capture:
    """The engine's steps and rings at the trigger: the step records are built from the step
    window's columns when asked and are frozen (``collector.ingest.window``), the other records
    held are never changed, so a capture built later still holds what they held."""
    info = view.engine(engine)
    steps, run = run_steps(view, engine, trigger)
    steps, lost = held_blocks(steps)
    samples = view.gpu_samples(since=trigger.ts - gpu_seconds, gpus=set(info.gpus) if info is not None and info.gpus else None)
    horizon = (steps[0].ts if steps else trigger.ts) - 60.0
    extra: dict[str, Any] = {"configured": bool(info and info.configured), "scrape_interval_s": scrape_interval}
    last = view.last_scrape(engine)
    if last is not None:
        extra["last_scrape"] = {"ts": last.ts, "values": dict(last.values)}
    if info is not None and info.pair:
        extra["pair"] = info.pair
    extra.update(run)
    if lost:  # left in the engine's ring, which had overwritten them by the capture
        extra["request_blocks_lost"] = lost
    if not steps:
        extra["no_recorder"] = (
            "no step records from an in-engine recorder for this engine: install the package in the "
            "engine's environment (and --scheduler-cls collector.vllm.RecordingScheduler for per-request "
            "rows); the scrape series is all there is"
        )
    return Capture(
        host=view.host,
        engine=engine,
        trigger=own_copy(trigger),
        steps=steps,
        gpu_samples=samples,
        events=[own_copy(e) for e in view.events(engine, since=horizon)],
        log_lines=view.log_lines(engine),
        fingerprint=dict(info.fingerprint) if info is not None else {},
        extra=extra,
        scrapes=view.scrapes(engine, since=trigger.ts - scrape_seconds),
        workload=view.workload(engine, trigger.ts, crashed=trigger.kind in CRASH_KINDS),
    )


def held_blocks(steps: Sequence[StepRecord]) -> tuple[Sequence[StepRecord], int]:
    """The steps with their request blocks' bytes copied out of the ring where ingest left them
    (``collector.channel.blocks.RequestBlock.in_ring``): what a capture froze no longer depends
    on the ring, which its writer goes on overwriting. Returns them and how many blocks the ring
    no longer held (``gone``: those steps keep their figures, without their rows). A window's
    ``HeldSteps`` has its block column replaced, its records still built later (in the build's
    thread, not on the event loop)."""
    with_resident = getattr(steps, "with_resident_blocks", None)  # a window's HeldSteps (read through the view)
    if with_resident is not None:
        held: tuple[Sequence[StepRecord], int] = with_resident()
        return held
    at = [i for i, rec in enumerate(steps) if isinstance(rec.request_block, RequestBlock) and not rec.request_block.held]
    if not at:
        return steps, 0
    out = list(steps)
    copies = RequestBlock.resident_many([steps[i].request_block for i in at])  # type: ignore[misc]
    for i, block in zip(at, copies, strict=True):
        out[i] = replace(out[i], request_block=block)
    return out, sum(c.gone for c in copies)


def run_steps(view: IngestView, engine: str, trigger: Event) -> tuple[Sequence[StepRecord], dict[str, Any]]:
    """The steps of one run of the engine (``collector.ingest.runs``), never two: the previous
    run's for a trigger of that run (its ring's death, read after the engine came back), else the
    current run's; and what the snapshot's summary says of the runs (``run``, ``previous_run``:
    the run before the one held, or ``run_is_previous``: the one held ended, a newer one runs)."""
    runs = view.run_info(engine)
    wanted = trigger.data.get("run") if isinstance(trigger.data, dict) else None
    if runs.previous is not None and wanted == runs.previous:
        return view.previous_steps(engine), {"run": runs.previous, "run_is_previous": True, "next_run": runs.run}
    out: dict[str, Any] = {"run": runs.run} if runs.run else {}  # (0: steps that named no run)
    previous = runs.previous_summary()
    if previous is not None:
        out["previous_run"] = previous
    return view.steps(engine), out


def cut(cap: Capture, at: float) -> int:
    """A capture taken after its trigger's time (a retake, a trigger read again at start) as it
    was at ``at``: later steps and events left out. Returns how many steps were left out."""
    kept = [s for s in cap.steps if s.ts <= at]
    later = len(cap.steps) - len(kept)
    cap.steps = kept
    cap.events = sorted([e for e in cap.events if e.ts <= at and e.uid != cap.trigger.uid] + [cap.trigger], key=lambda e: e.ts)
    return later


def freeze(
    view: IngestView,
    engine: str,
    trigger: Event,
    *,
    gpu_seconds: float = 600.0,
    scrape_seconds: float = SCRAPE_SECONDS,
    scrape_interval: float | None = None,
) -> SnapshotDoc:
    """``capture`` then ``build`` in one call (tests, tools)."""
    return capture(view, engine, trigger, gpu_seconds=gpu_seconds, scrape_seconds=scrape_seconds, scrape_interval=scrape_interval).build()


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
    host: str,
    engine: str,
    trigger: Event,
    steps: Sequence[StepRecord],
    gpu_samples: Sequence[GpuSample],
    events: Sequence[Event],
    log_lines: Sequence[LogLine],
    fingerprint: dict[str, Any],
    extra_summary: dict[str, Any] | None,
    created_at: float | None,
) -> SnapshotDoc:
    requests = request_table(steps)
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
        requests=requests,
        gpu_samples=[g.to_dict() for g in gpu_samples],
        events=[redact(e.to_dict()) for e in events],
        log_lines=[{"ts": line.ts, "line": redact(line.line)} for line in log_lines],
    )
