"""A replay plan: a snapshot's workload cut into phases by concurrency level (pure, no I/O).

The incident's load was a benchmark ramp: C1, C2, C4, C8, C16, each level held until its
requests were done. A request's **level** is the most requests in flight at any time during its
life (arrival to end, or to the fault when it never ended); consecutive requests (by arrival)
with the same level form a **phase**. For a closed-loop ramp that gives the ramp's levels
exactly: a request of the C4 phase starts when 3 others run and keeps 4 in flight until the
phase drains. A phase **waits** (``barrier``) when, in the original, it started only after
every request of the phase before had ended; the driver then waits the same way, so a slower
target does not mix two levels.

A phase is **closed-loop** when its client sent each request beyond the first ``concurrency``
as a response came back: the request arrived within ``CLOSED_LOOP_GAP_S`` of an earlier
request's end that no other arrival answered, with fewer than ``concurrency`` others in flight.
That holds for at least ``CLOSED_LOOP_SHARE`` of them in a benchmark ramp. An open-loop
(rate-driven) load whose arrivals happen to follow ends that closely is paced by slots too: the
replay then holds its level, not its rate. The driver paces a
closed-loop phase by its slots, not by the recorded offsets: on a faster target the offsets
would let the level fall (a request done before the next one's offset), on a slower one they
change nothing.

Prefix reuse follows the cache hits the engine recorded, nothing else: a request that had
``cached_tokens`` = c reuses the first c tokens of the most recent earlier request long enough
to hold them (the original's sharing structure is not recorded, only its extent). Every other
token is fresh (``collector.replay.prompts``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from collector.errors import InputError

CLOSED_LOOP_GAP_S = 0.25  # a response to the next request, for a client on the same node or rack
CLOSED_LOOP_SHARE = 0.8


class PlanError(InputError):
    """A snapshot whose workload cannot be replayed (none recorded, nothing in it)."""


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int  # position in arrival order
    id: str | None  # the original request id, for reference only
    offset: float  # arrival, seconds after the first arrival
    prompt_len: int
    max_tokens: int | None
    n: int | None
    ignore_eos: bool | None
    has_stop: bool | None
    level: int
    outcome: str  # the original's: finished | aborted | error | failed_by_crash | in_flight
    output_len: int | None
    prefix_of: int | None = None  # index of the request whose first prefix_len tokens it reuses
    prefix_len: int = 0


@dataclass(slots=True)
class PlanPhase:
    number: int  # 1-based
    concurrency: int
    requests: list[PlannedRequest]
    barrier: bool  # the original started it once the phase before had drained
    closed_loop: bool = False  # its client sent each request when a slot came free
    start: float = 0.0  # first arrival offset
    end: float = 0.0  # last end (or the fault) offset

    def original(self, outcome: str) -> int:
        return sum(1 for r in self.requests if r.outcome == outcome)

    @property
    def original_failed(self) -> int:
        return sum(1 for r in self.requests if r.outcome in ("error", "failed_by_crash", "aborted"))


@dataclass(slots=True)
class Plan:
    phases: list[PlanPhase]
    crashed: bool
    fault_offset: float | None  # the fault, seconds after the first arrival
    truncated: dict[str, Any] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0  # requests without a prompt length: nothing to send
    source: dict[str, Any] = field(default_factory=dict)  # snapshot id, engine, model

    @property
    def requests(self) -> list[PlannedRequest]:
        return [r for p in self.phases for r in p.requests]

    @property
    def crash_phase(self) -> PlanPhase | None:
        """The phase the fault fell in: the last one holding a request failed by the crash."""
        hit = [p for p in self.phases if p.original("failed_by_crash")]
        return hit[-1] if hit else None


def _rows(workload: dict[str, Any]) -> list[dict[str, Any]]:
    cols = (workload.get("requests") or {}).get("columns") or {}
    ids = cols.get("id") or []
    return [{k: (v[i] if i < len(v) else None) for k, v in cols.items()} for i in range(len(ids))]


def levels(arrivals: list[float], ends: list[float | None], until: float) -> list[int]:
    """Each request's level: the most requests in flight during its life. Ends at the same
    time as arrivals count first (a closed-loop client sends when a response returns); a request
    without an end is still in flight at ``until``, so an arrival at ``until`` meets it."""
    events = [(a, 1, i) for i, a in enumerate(arrivals)]
    events += [(e, 0, i) if e is not None else (until, 2, i) for i, e in enumerate(ends)]
    events.sort(key=lambda ev: (ev[0], ev[1]))
    open_: set[int] = set()
    out = [0] * len(arrivals)
    for _, kind, i in events:
        if kind == 0:
            open_.discard(i)
            continue
        open_.add(i)
        level = len(open_)
        for j in open_:  # O(requests x concurrency): 10,000 x 256 is a few million steps
            if out[j] < level:
                out[j] = level
    return out


def in_flight_at_arrival(arrivals: list[float], ends: list[float | None]) -> list[int]:
    """For each request, how many others were in flight when it arrived (ends at the same time
    as an arrival count first, as in ``levels``)."""
    events = sorted([(a, 1, i) for i, a in enumerate(arrivals)] + [(e, 0, i) for i, e in enumerate(ends) if e is not None])
    out, open_ = [0] * len(arrivals), 0
    for _, kind, i in events:
        if kind == 0:
            open_ -= 1
        else:
            out[i] = open_
            open_ += 1
    return out


def closed_loop(arrivals: list[float], ends: list[float | None], before: list[int], members: list[int], concurrency: int) -> bool:
    """Whether the requests ``members`` (indices, in arrival order) were sent by a closed-loop
    client holding ``concurrency`` in flight (see the module's docstring); ``before`` is
    ``in_flight_at_arrival``'s answer."""
    later = members[concurrency:]
    if not later:
        return True  # all sent at once: nothing to pace
    done = sorted(e for e in ends if e is not None)
    used: set[int] = set()
    hits = 0
    for i in later:
        a = arrivals[i]
        k = bisect.bisect_right(done, a) - 1  # the latest end at or before the arrival not answered yet
        while k >= 0 and k in used and a - done[k] <= CLOSED_LOOP_GAP_S:
            k -= 1
        if k >= 0 and k not in used and a - done[k] <= CLOSED_LOOP_GAP_S and before[i] < concurrency:
            used.add(k)
            hits += 1
    return hits >= CLOSED_LOOP_SHARE * len(later)


def build_plan(workload: dict[str, Any] | None, *, source: dict[str, Any] | None = None) -> Plan:
    if not workload:
        raise PlanError("the snapshot holds no workload (recorded before the workload log existed, or by an engine without the recorder)")
    rows = sorted(_rows(workload), key=lambda r: float(r.get("arrival_offset") or 0.0))
    usable = [r for r in rows if isinstance(r.get("prompt_len"), int) and r["prompt_len"] > 0]
    if not usable:
        raise PlanError("the snapshot's workload holds no request with a prompt length")
    fault_ts, t0 = workload.get("fault_ts"), workload.get("t0")
    fault = float(fault_ts) - float(t0) if isinstance(fault_ts, (int, float)) and isinstance(t0, (int, float)) else None
    base = float(usable[0]["arrival_offset"] or 0.0)
    arrivals = [float(r["arrival_offset"] or 0.0) - base for r in usable]
    ends = [float(r["end_offset"]) - base if r.get("end_offset") is not None else None for r in usable]
    # the fault cannot come before what the engine recorded: vLLM's log gives the crash to the
    # second, and requests that arrived in that second were in flight at the death, not after it
    latest = max([a for a in arrivals] + [e for e in ends if e is not None])
    until = max(fault - base, latest) if fault is not None else latest
    lv = levels(arrivals, ends, until)
    reqs: list[PlannedRequest] = []
    for i, r in enumerate(usable):
        prefix_of, prefix_len = None, 0
        cached = r.get("cached_tokens")
        if isinstance(cached, int) and cached > 0:
            donor = next((j for j in range(i - 1, -1, -1) if usable[j]["prompt_len"] >= cached), None)
            if donor is not None:
                prefix_of, prefix_len = donor, min(cached, r["prompt_len"])
        reqs.append(
            PlannedRequest(
                index=i,
                id=r.get("id"),
                offset=round(arrivals[i], 6),
                prompt_len=int(r["prompt_len"]),
                max_tokens=r.get("max_tokens"),
                n=r.get("n"),
                ignore_eos=r.get("ignore_eos"),
                has_stop=r.get("has_stop"),
                level=lv[i],
                outcome=str(r.get("outcome") or "finished"),
                output_len=r.get("output_len"),
                prefix_of=prefix_of,
                prefix_len=prefix_len,
            )
        )
    before = in_flight_at_arrival(arrivals, ends)
    phases: list[PlanPhase] = []
    for req in reqs:
        if phases and phases[-1].concurrency == req.level:
            phases[-1].requests.append(req)
        else:
            phases.append(PlanPhase(number=len(phases) + 1, concurrency=req.level, requests=[req], barrier=False))
    for k, ph in enumerate(phases):
        ph.start = ph.requests[0].offset
        ph_ends = [ends[r.index] for r in ph.requests]
        ph.end = max((e if e is not None else until) for e in ph_ends)
        if k:
            prev = phases[k - 1]
            prev_ends = [ends[r.index] for r in prev.requests]
            ph.barrier = all(e is not None and e <= ph.start for e in prev_ends)
        ph.closed_loop = closed_loop(arrivals, ends, before, [r.index for r in ph.requests], ph.concurrency)
    return Plan(
        phases=phases,
        crashed=bool(workload.get("crashed")),
        fault_offset=round(until, 6) if fault is not None else None,
        truncated=dict(workload.get("truncated") or {}),
        window=dict(workload.get("window") or {}),
        skipped=len(rows) - len(usable),
        source=dict(source or {}),
    )
