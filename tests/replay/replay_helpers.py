"""Workloads for the replay tests, built through the real WorkloadLog from a simulated
closed-loop ramp client (the shape of the incident's benchmark)."""

from __future__ import annotations

from typing import Any

from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd


def ramp_workload(
    levels: tuple[tuple[int, int], ...] = ((1, 2), (2, 4), (4, 8)),
    *,
    prompt_len: int = 32000,
    max_tokens: int = 2000,
    duration: float = 10.0,
    crash_in_last_after: int | None = None,
    cached: int = 0,
    fault_known_early_by: float = 0.0,
) -> dict[str, Any]:
    """Each (concurrency, requests) level runs closed-loop: a request takes ``duration`` s and
    the next one is sent when one returns; the next level starts when the level has drained.
    With ``crash_in_last_after`` = k the engine dies in the last level after k are done;
    ``fault_known_early_by`` puts the recorded fault time that much before the true one (vLLM's
    log gives the crash to the second, so requests may arrive after the recorded fault)."""
    log = WorkloadLog()
    t, seq = 1000.0, 0
    fault = None
    for li, (conc, count) in enumerate(levels):
        last = li == len(levels) - 1
        in_flight: list[tuple[float, str]] = []
        sent = done = 0
        while done < count:
            while len(in_flight) < conc and sent < count:
                seq += 1
                rid = f"cmpl-{seq}"
                # the level's first requests start 0.01 s apart, the next one when one returns
                start = t + (0.01 * len(in_flight) if sent < conc else 0.0)
                log.add(WorkloadBatch("decode-0", start, [WorkloadArrival(rid, start, prompt_len, max_tokens, 1, True, False)]))
                in_flight.append((start + duration, rid))
                sent += 1
            in_flight.sort()
            t_end, rid = in_flight.pop(0)
            if last and crash_in_last_after is not None and done == crash_in_last_after:
                fault = t_end - 0.001
                break
            log.add(WorkloadBatch("decode-0", t_end, [WorkloadEnd(rid, t_end, max_tokens, "length", 0 if rid == "cmpl-1" else cached)]))
            done += 1
            t = t_end
        if fault is not None:
            break
        t += 0.5
    if fault is not None:
        fault -= fault_known_early_by
    return log.export(fault if fault is not None else t, crashed=fault is not None)
