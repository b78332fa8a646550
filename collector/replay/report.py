"""What a replay prints: the plan, progress while it runs, and the per-phase table at the end.

The table is the incident report's (concurrency level, requests done, failed, time), with the
original's figures beside the replay's so that "the same point of the load" can be read off.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, TextIO

from collector.replay.compare import Comparison
from collector.replay.driver import ReplayResult
from collector.replay.plan import Plan


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _stats(values: list[int]) -> str:
    if not values:
        return "-"
    return f"{min(values)}/{round(sum(values) / len(values))}/{max(values)}"


def plan_text(plan: Plan) -> str:
    src = plan.source
    reqs = plan.requests
    head = f"plan of snapshot {src.get('id', '?')} ({src.get('engine', '?')}"
    head += ", the engine died)" if plan.crashed else ", the engine was alive)"
    span = max((p.end for p in plan.phases), default=0.0)
    lines = [
        f"{head}: {len(reqs)} requests over {clock_text(span)}"
        + (f", fault at {clock_text(plan.fault_offset)}" if plan.fault_offset is not None else "")
    ]
    lines.append(
        f"{'phase':>5} {'conc':>5} {'reqs':>5} {'from':>8} {'to':>8}  {'prompt min/mean/max':>21} "
        f"{'max_tokens':>16} {'ignore_eos':>10} {'prefix':>6}  original done/failed"
    )
    for p in plan.phases:
        max_tok = [r.max_tokens for r in p.requests if r.max_tokens is not None]
        ign = sum(1 for r in p.requests if r.ignore_eos)
        shared = sum(1 for r in p.requests if r.prefix_of is not None)
        lines.append(
            f"{p.number:>5} {'C' + str(p.concurrency):>5} {len(p.requests):>5} {clock_text(p.start):>8} "
            f"{clock_text(p.end):>8}  {_stats([r.prompt_len for r in p.requests]):>21} {_stats(max_tok):>16} "
            f"{ign:>10} {shared:>6}  {p.original('finished')}/{p.original_failed}" + ("  <- fault" if p is plan.crash_phase else "")
        )
    stops = sum(1 for r in reqs if r.has_stop)
    notes = []
    if stops:
        notes.append(f"{stops} requests had stop conditions: not replayed (their text is not recorded)")
    if plan.skipped:
        notes.append(f"{plan.skipped} requests without a prompt length are left out")
    trunc = plan.truncated
    if trunc.get("any"):
        notes.append(
            f"the log was truncated (dropped {trunc.get('dropped_by_count', 0)} by count, "
            f"{trunc.get('dropped_by_age', 0)} by age): the load began earlier"
        )
    win = plan.window
    if win:
        notes.append(f"window: up to {clock_text(win.get('max_age_s'))} or {win.get('max_requests')} requests")
    return "\n".join(lines + [f"  {n}" for n in notes])


def _stat_dict(values: list[int]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"min": min(values), "mean": round(sum(values) / len(values), 1), "max": max(values)}


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan as data (``replay --plan --json``): what the table says, one field each, plus
    every planned request (the original ids stay out: they are the user's)."""
    reqs = plan.requests
    return {
        "source": plan.source,
        "crashed": plan.crashed,
        "fault_offset_s": plan.fault_offset,
        "requests": len(reqs),
        "span_s": max((p.end for p in plan.phases), default=0.0),
        "crash_phase": plan.crash_phase.number if plan.crash_phase else None,
        "skipped": plan.skipped,
        "with_stop_conditions": sum(1 for r in reqs if r.has_stop),
        "truncated": plan.truncated,
        "window": plan.window,
        "phases": [
            {
                "phase": p.number,
                "concurrency": p.concurrency,
                "requests": len(p.requests),
                "start_s": p.start,
                "end_s": p.end,
                "barrier": p.barrier,
                "closed_loop": p.closed_loop,
                "prompt_len": _stat_dict([r.prompt_len for r in p.requests]),
                "max_tokens": _stat_dict([r.max_tokens for r in p.requests if r.max_tokens is not None]),
                "ignore_eos": sum(1 for r in p.requests if r.ignore_eos),
                "prefix_shared": sum(1 for r in p.requests if r.prefix_of is not None),
                "original_done": p.original("finished"),
                "original_failed": p.original_failed,
                "fault": p is plan.crash_phase,
            }
            for p in plan.phases
        ],
        "planned": [
            {
                "index": r.index,
                "offset_s": r.offset,
                "prompt_len": r.prompt_len,
                "max_tokens": r.max_tokens,
                "n": r.n,
                "ignore_eos": r.ignore_eos,
                "level": r.level,
                "outcome": r.outcome,
                "output_len": r.output_len,
                "prefix_of": r.prefix_of,
                "prefix_len": r.prefix_len,
            }
            for r in reqs
        ],
    }


def result_table(plan: Plan, result: ReplayResult) -> str:
    lines = [f"{'phase':>5} {'conc':>5} {'planned':>7} {'done':>5} {'failed':>6} {'not sent':>8} {'time':>8}   original: {'done':>4} {'failed':>6}"]
    for p, r in zip(plan.phases, result.phases, strict=True):
        lines.append(
            f"{r.number:>5} {'C' + str(r.concurrency):>5} {r.planned:>7} {r.done:>5} {r.failed:>6} {r.not_sent:>8} "
            f"{clock_text(r.seconds):>8}             {p.original('finished'):>4} {p.original_failed:>6}"
        )
    lines.append(
        f"{'total':>5} {'':>5} {sum(r.planned for r in result.phases):>7} {result.done:>5} "
        f"{result.failed:>6} {sum(r.not_sent for r in result.phases):>8} {clock_text(result.elapsed):>8}"
    )
    return "\n".join(lines)


def verdict_text(plan: Plan, result: ReplayResult, snapshot: dict[str, Any] | None) -> str:
    out = []
    if result.died and result.died_phase is not None:
        ph = plan.phases[result.died_phase - 1]
        out.append(
            f"engine died again: yes, in phase {ph.number} (C{ph.concurrency}) after "
            f"{result.done_before_death} done there, {clock_text(result.died_at)} into the replay"
        )
        orig = plan.crash_phase
        if orig is not None:
            same = "the same phase" if orig.number == ph.number else f"phase {orig.number} (C{orig.concurrency})"
            out.append(f"  the original died in {same} after {orig.original('finished')} done there")
    elif result.interrupted:
        out.append("replay interrupted: the table shows the load so far")
    else:
        out.append("engine died again: no")
    if snapshot is not None:
        out.append(
            f"new snapshot: {snapshot.get('id')} ({snapshot.get('engine')}, trigger {snapshot.get('trigger_kind')})"
            + (f"  {snapshot['url']}" if snapshot.get("url") else "")
        )
    if result.errors:
        out.append("first failures: " + " | ".join(result.errors))
    return "\n".join(out)


def comparison_text(cmp: Comparison) -> str:
    def word(ok: bool | None) -> str:
        return "n/a" if ok is None else ("same" if ok else "DIFFERENT")

    head = (
        f"replayed workload vs the original (collector.replay.compare tolerances): prompt lengths "
        f"{word(cmp.same_prompts)}, max tokens {word(cmp.same_max_tokens)}, concurrency "
        f"{word(cmp.same_concurrency)}, fault point {word(cmp.same_fault_point)}"
    )
    return "\n".join([head] + [f"  {n}" for n in cmp.notes])


class Progress(Protocol):
    def update(self, result: ReplayResult, elapsed: float) -> None: ...
    def close(self) -> None: ...


def _line(result: ReplayResult, elapsed: float) -> str:
    cur = result.current
    phase = f"phase {cur.number}/{len(result.phases)} C{cur.concurrency}" if cur else "starting"
    rate = result.done / elapsed if elapsed > 0 else 0.0
    in_flight = sum(p.in_flight for p in result.phases)
    return f"{phase}  done {result.done}  failed {result.failed}  in flight {in_flight}  elapsed {clock_text(elapsed)}  rate {rate:.2f} req/s"


class TtyProgress:
    """One status line, rewritten in place."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def update(self, result: ReplayResult, elapsed: float) -> None:
        self.out.write("\r\x1b[K" + _line(result, elapsed))
        self.out.flush()

    def close(self) -> None:
        self.out.write("\r\x1b[K")
        self.out.flush()


class LineProgress:
    """Plain lines for logs: at each phase change and every ``every`` seconds."""

    def __init__(self, out: TextIO, *, every: float = 10.0, clock: Any = time.monotonic) -> None:
        self.out, self.every, self.clock = out, every, clock
        self._last = float("-inf")
        self._phase: int | None = None

    def update(self, result: ReplayResult, elapsed: float) -> None:
        cur = result.current.number if result.current else None
        now = self.clock()
        if cur != self._phase or now - self._last >= self.every:
            self._phase, self._last = cur, now
            self.out.write(_line(result, elapsed) + "\n")
            self.out.flush()

    def close(self) -> None:
        pass
