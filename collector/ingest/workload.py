"""The workload log: the requests an engine served before a fault, kept for replay.

The step ring says what the engine was doing in its last few thousand steps (seconds to
minutes); a load that takes half an hour to break an engine needs the requests themselves,
over a longer window. This log keeps, per request, what shapes the work and nothing of its
content (no prompt, no output text): arrival time, prompt length, max tokens, the sampling
settings that change the work (``n``, ``ignore_eos``, whether stop conditions were set), and
how it ended (output length reached, finish reason, prefix-cache hits).

It is fed the recorder's ``wl`` records (``collector.channel.codec``)::

    arrive: {"ev": "arrive", "id", "ts" (arrival), "prompt_len", "max_tokens", "n",
             "ignore_eos", "has_stop"}
    end:    {"ev": "end", "id", "ts", "output_len", "finish", "cached_tokens"}

Bounded twice: at most ``max_requests`` requests (the oldest go first), and a request that
ended more than ``max_age_s`` before the newest record is dropped. A request still in flight
is never dropped for its age: a long request that is running at the fault is part of the load
that broke the engine. Both kinds of drop are counted and exported, so a plan can say that it
does not start at the beginning of the load.

``export`` reads the log's state (no clock): the requests in flight at some time in
``[fault_ts - max_age_s, fault_ts]``, columnar, with times as offsets from the first kept
arrival, each request's outcome at the fault, and the concurrency over time.

An engine that died ends its requests without end records. An export with ``crashed`` therefore
closes the requests still open at the fault (they failed by the crash), and a later export
starts after that death: a restarted engine under the same name is a fresh process, and the
previous one's load is not the load before its fault. Exporting the same fault again (the
snapshot's amendment) gives the same workload, completed with the records read since.

A fault's time is when the first source saw it: an Xid ~0.4 s before the workers' errors, a
vLLM log line to the second. The engine's own records cannot postdate its death, so for a
crash everything it recorded up to ``DEATH_GRACE_S`` after the fault time counts as before the
death (an end that arrives after the first capture still replaces the crash's close), and a
restarted engine, which takes longer than that to serve again, starts after it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from collector.model import WorkloadRecord

SCHEMA = "flightrec.workload/v1"
DEFAULT_MAX_REQUESTS = 10_000
DEFAULT_MAX_AGE_S = 3600.0
MAX_EARLY_ENDS = 1024  # ends held for an arrival not yet read (the two records may cross)
MAX_DEATHS = 64  # engine deaths remembered (each starts the log afresh)
DEATH_GRACE_S = 5.0
CRASH_FINISH = "\0engine_died"  # the end a crash gives open requests (no recorder writes it)

# vLLM's finish reasons (FinishReason / RequestStatus, lower-cased by the recorder) and what
# each means for replay. Anything else is reported as it came, outcome "finished".
_ABORTED = frozenset({"aborted", "abort", "cancelled"})
_ERROR = frozenset({"error"})
OUTCOMES = ("finished", "aborted", "error", "failed_by_crash", "in_flight")
COLUMNS = (
    "id",
    "arrival_offset",
    "prompt_len",
    "max_tokens",
    "n",
    "ignore_eos",
    "has_stop",
    "end_offset",
    "output_len",
    "finish",
    "outcome",
    "cached_tokens",
)


@dataclass(slots=True)
class _Request:
    id: str
    engine: str
    arrival: float
    prompt_len: int | None
    max_tokens: int | None
    n: int | None
    ignore_eos: bool | None
    has_stop: bool | None
    end: float | None = None
    output_len: int | None = None
    finish: str | None = None
    cached_tokens: int | None = None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


class WorkloadLog:
    def __init__(self, *, max_requests: int = DEFAULT_MAX_REQUESTS, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        if max_requests < 0 or max_age_s <= 0:
            raise ValueError("max_requests must be 0 (keep nothing) or more, max_age_s positive")
        self.max_requests = max_requests
        self.max_age_s = float(max_age_s)
        # keyed by a sequence number: a client may reuse a request id once the first has ended
        self._requests: OrderedDict[int, _Request] = OrderedDict()
        self._open: dict[tuple[str, str], int] = {}  # (engine, id) of requests without an end
        self._early_ends: OrderedDict[tuple[str, str], WorkloadRecord] = OrderedDict()
        self._seq = 0
        self._newest = float("-inf")
        self._deaths: list[float] = []
        self.dropped_by_count = 0
        self.dropped_by_age = 0
        self.ends_without_arrival = 0

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, rec: WorkloadRecord) -> None:
        if not self.max_requests:  # the log is turned off (workload_requests: 0)
            return
        d = rec.data
        key = (rec.engine, str(d.get("id")))
        self._newest = max(self._newest, rec.ts)
        if d.get("ev") == "arrive":
            self._arrive(key, rec)
        elif d.get("ev") == "end":
            self._end(key, rec)
        self._prune()

    def _arrive(self, key: tuple[str, str], rec: WorkloadRecord) -> None:
        d = rec.data
        self._seq += 1
        self._requests[self._seq] = _Request(
            id=key[1],
            engine=rec.engine,
            arrival=rec.ts,
            prompt_len=_int(d.get("prompt_len")),
            max_tokens=_int(d.get("max_tokens")),
            n=_int(d.get("n")),
            ignore_eos=_bool(d.get("ignore_eos")),
            has_stop=_bool(d.get("has_stop")),
        )
        self._open[key] = self._seq
        early = self._early_ends.pop(key, None)
        if early is not None:
            self._end(key, early)

    def _end(self, key: tuple[str, str], rec: WorkloadRecord) -> None:
        seq = self._open.pop(key, None)
        req = self._requests.get(seq) if seq is not None else None
        if req is None:
            # the arrival may still be on its way (another ring), or before the log began
            self._early_ends[key] = rec
            if len(self._early_ends) > MAX_EARLY_ENDS:
                self._early_ends.popitem(last=False)
                self.ends_without_arrival += 1
            return
        d = rec.data
        req.end = rec.ts
        req.output_len = _int(d.get("output_len"))
        finish = d.get("finish")
        req.finish = str(finish) if finish is not None else None
        req.cached_tokens = _int(d.get("cached_tokens"))

    def _prune(self) -> None:
        while len(self._requests) > self.max_requests:
            _, old = self._requests.popitem(last=False)
            self._open.pop((old.engine, old.id), None)
            self.dropped_by_count += 1
        horizon = self._newest - self.max_age_s
        # ended requests are dropped from the oldest arrival on, stopping at the first one that
        # is still needed: the log stays ordered by arrival, a cheap check per record
        while self._requests:
            seq, old = next(iter(self._requests.items()))
            if old.end is None or old.end >= horizon:
                break
            del self._requests[seq]
            if self._open.get((old.engine, old.id)) == seq:  # closed by a crash, never by its end
                del self._open[(old.engine, old.id)]
            self.dropped_by_age += 1

    def export(self, fault_ts: float, *, crashed: bool, engine: str | None = None) -> dict[str, Any]:
        """The workload up to ``fault_ts`` (of one engine when ``engine`` is given).

        A request that arrived but had not ended at ``fault_ts`` failed by the crash when the
        engine died (``crashed``), else it was in flight when the snapshot was taken. An end
        recorded after ``fault_ts`` is ignored for the same reason: at the fault it had not
        ended."""
        start = fault_ts - self.max_age_s
        cutoff = fault_ts + DEATH_GRACE_S if crashed else fault_ts
        died_before = max((d for d in self._deaths if d < fault_ts), default=None)
        after = died_before + DEATH_GRACE_S if died_before is not None else None
        kept = [
            r
            for r in self._requests.values()
            if (engine is None or r.engine == engine)
            and r.arrival <= cutoff
            and (r.end is None or r.end >= start)
            and (after is None or r.arrival > after)
        ]
        after_fault = sum(1 for r in self._requests.values() if (engine is None or r.engine == engine) and r.arrival > cutoff)
        if crashed:
            self._died(fault_ts, kept)
        t0 = min((r.arrival for r in kept), default=fault_ts)
        last = max(
            [fault_ts] + [r.end for r in kept if r.end is not None and r.end <= cutoff and r.finish != CRASH_FINISH] + [r.arrival for r in kept]
        )
        cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        counts = dict.fromkeys(OUTCOMES, 0)
        for r in kept:
            ended = r.end is not None and r.end <= cutoff and r.finish != CRASH_FINISH
            outcome = _outcome(r.finish) if ended else ("failed_by_crash" if crashed else "in_flight")
            counts[outcome] += 1
            row = {
                "id": r.id,
                "arrival_offset": round(r.arrival - t0, 6),
                "prompt_len": r.prompt_len,
                "max_tokens": r.max_tokens,
                "n": r.n,
                "ignore_eos": r.ignore_eos,
                "has_stop": r.has_stop,
                "end_offset": round(r.end - t0, 6) if ended and r.end is not None else None,
                "output_len": r.output_len if ended else None,
                "finish": r.finish if ended else None,
                "outcome": outcome,
                "cached_tokens": r.cached_tokens if ended else None,
            }
            for c in COLUMNS:
                cols[c].append(row[c])
        return {
            "schema": SCHEMA,
            "fault_ts": fault_ts,
            "crashed": crashed,
            "t0": t0,
            "window": {
                "start": max(start, t0) if kept else start,
                "end": fault_ts,
                "max_age_s": self.max_age_s,
                "max_requests": self.max_requests,
                "after_death_at": died_before,
            },
            "truncated": {
                "any": bool(self.dropped_by_count or self.dropped_by_age or self.ends_without_arrival),
                "dropped_by_count": self.dropped_by_count,
                "dropped_by_age": self.dropped_by_age,
                "ends_without_arrival": self.ends_without_arrival + len(self._early_ends),
                "arrived_after_fault": after_fault,
            },
            "counts": {"requests": len(kept), **counts},
            "requests": {"columns": cols},
            "concurrency": concurrency_series(cols["arrival_offset"], cols["end_offset"], round(last - t0, 6)),
        }

    def _died(self, ts: float, kept: list[_Request]) -> None:
        """The engine died at ``ts``: what was open there ends there, failed by the crash."""
        for r in kept:
            if r.end is None:  # stays open: its own end, read late, replaces this one
                r.end, r.finish = ts + DEATH_GRACE_S, CRASH_FINISH
        if ts not in self._deaths:
            self._deaths = sorted([*self._deaths, ts])[-MAX_DEATHS:]


def _outcome(finish: str | None) -> str:
    if finish is None:
        return "finished"
    f = finish.lower()
    if f in _ABORTED or "abort" in f:
        return "aborted"
    if f in _ERROR:
        return "error"
    return "finished"


def concurrency_series(arrivals: list[float], ends: list[float | None], until: float) -> list[list[float]]:
    """``[[offset, in_flight], ...]`` at every change, ends before arrivals at the same time
    (a closed-loop client sends the next request when the last one returns). A request with no
    end stays in flight until ``until``, where the series closes."""
    changes: list[tuple[float, int]] = [(a, 1) for a in arrivals]
    changes += [(e, -1) for e in ends if e is not None]
    changes.sort(key=lambda c: (c[0], c[1]))
    out: list[list[float]] = []
    level = 0
    for t, delta in changes:
        level += delta
        if out and out[-1][0] == t:
            out[-1][1] = level
        else:
            out.append([t, level])
    if out and out[-1][0] < until:
        out.append([until, level])
    return out
