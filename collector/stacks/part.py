"""The ``stacks`` part of a snapshot document (``flightrec.stacks/v1``), built from what a capture
read (pure).

    {"schema": "flightrec.stacks/v1",
     "status": "captured" | "partial" | "unavailable" | "reading",
     "reasons": ["stacks not read: kernel.yama.ptrace_scope is 1 ... [engine_core 4242, worker 4250]"],
     "started_at": 1796045430.1, "finished_at": 1796045433.4, "interval_s": 3.0,
     "tool": {"name": "py-spy", "version": "0.4.3"},
     "processes": [
       {"pid": 48213, "own_pid": 1, "ppid": 48190, "role": "engine_core", "title": "VLLM::EngineCore",
        "uid": 0, "state": "stuck" | "moving" | "idle" | "unknown" | "unread",
        "dumps": [{"ts": ..., "seconds": 0.09, "native": false, "error": null}, ...],
        "blocking": {"tid": 48213, "thread": "MainThread", "state": "stuck",
                     "frame": {"function": "schedule", "file": "vllm/v1/core/sched/scheduler.py", "line": 412},
                     "in": {...} | null} | null,
        "threads": [{"tid", "name", "main", "state", "active": [false, false], "owns_gil",
                     "blocking": 0 | null,
                     "frames": [{"function", "file", "line", "native"?, "moved"}, ...],   innermost first
                     "first_frames": [...]}],                                              moved threads only
        "env": {"NCCL_DEBUG": null, ...}}],          what differs from the engine's environment
     "env": {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", ...},
     "gpus": [{"gpu", "index", "name", "bus_id", "readings": [{ts, utilization, ...} | null, ...],
               "processes": [{"pid", "used_memory", "role"}], "hint"}],
     "notes": ["the engine's processes run in their own pid namespace: its pid 1 is 48213 here"]}

Processes are listed where a step runs first (engine core, workers, API server); within a
process, the lead thread first (``collector.stacks.compare``). File paths carry no install
prefix (``collector.stacks.paths``). A snapshot whose trigger is not a wedge has no such part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collector.stacks import compare, roles
from collector.stacks.finder import EngineProcess
from collector.stacks.pyspy import Dump

SCHEMA = "flightrec.stacks/v1"
CAPTURED, PARTIAL, UNAVAILABLE, READING = "captured", "partial", "unavailable", "reading"


def reading(started_at: float, interval_s: float) -> dict[str, Any]:
    """What a first commit holds while the stacks are being read: its amendment holds them."""
    return {
        "schema": SCHEMA,
        "status": READING,
        "reasons": [f"being read when the snapshot was first committed (two dumps {interval_s:g} s apart): the snapshot's amendment holds them"],
        "started_at": started_at,
        "processes": [],
    }


def unavailable(reason: str, *, started_at: float | None = None, finished_at: float | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "status": UNAVAILABLE,
        "reasons": [reason],
        "started_at": started_at,
        "finished_at": finished_at,
        "processes": [],
        **extra,
    }


def process_entry(p: EngineProcess, first: Dump | None, second: Dump | None, env_diff: Mapping[str, str | None] | None) -> dict[str, Any]:
    dumps = [d for d in (first, second) if d is not None]
    ok1 = first.threads if first is not None and first.ok else None
    ok2 = second.threads if second is not None and second.ok else None
    threads = compare.compare(ok1, ok2, pid=p.pid, step_process=p.role in roles.STEP_ROLES) if (ok1 or ok2) else []
    v = compare.verdict(threads)
    out = p.to_dict()
    out.update(
        state=v.state,
        dumps=[{"ts": d.started, "seconds": round(d.seconds, 4), "native": d.native, "error": d.error if not d.ok else None} for d in dumps],
        blocking=v.blocking(),
        threads=[t.to_dict() for t in threads],
    )
    if env_diff:
        out["env"] = dict(env_diff)
    return out


def build(
    *,
    processes: Sequence[dict[str, Any]],
    reasons: Sequence[str],
    started_at: float,
    finished_at: float,
    interval_s: float,
    tool: Mapping[str, Any],
    env: Mapping[str, str],
    gpus: Sequence[dict[str, Any]],
    notes: Sequence[str],
) -> dict[str, Any]:
    read = [p for p in processes if p["state"] != "unread"]
    both = [p for p in read if len([d for d in p["dumps"] if d["error"] is None]) >= 2]
    dumped = [p for p in processes if p["role"] in roles.DUMPED]
    status = CAPTURED if dumped and len(both) == len(dumped) and not reasons else PARTIAL if read else UNAVAILABLE
    return {
        "schema": SCHEMA,
        "status": status,
        "reasons": list(reasons),
        "started_at": started_at,
        "finished_at": finished_at,
        "interval_s": interval_s,
        "tool": dict(tool),
        "processes": list(processes),
        "env": dict(env),
        "gpus": list(gpus),
        "notes": list(notes),
    }


def summary(part: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the snapshot's summary keeps of the part: its status, the first reason, and each
    read process's state and blocking frame (``"schedule (vllm/v1/core/sched/scheduler.py:412)"``)."""
    if not part:
        return None
    procs = []
    for p in part.get("processes") or []:
        b = p.get("blocking") or {}
        f = b.get("frame") or {}
        procs.append(
            {
                "role": p.get("role"),
                "pid": p.get("pid"),
                "title": p.get("title"),
                "state": p.get("state"),
                "os_state": p.get("os_state"),
                "blocking": f"{f.get('function')} ({f.get('file')}:{f.get('line')})" if f else None,
            }
        )
    reasons = part.get("reasons") or []
    return {"status": part.get("status"), "reason": reasons[0] if reasons else None, "processes": procs}
