"""The workload log: the requests an engine served before a fault, kept for replay.

The step ring says what the engine was doing in its last few thousand steps (seconds to
minutes); a load that takes half an hour to break an engine needs the requests themselves,
over a longer window. This log keeps, per request, what shapes the work and nothing of its
content (no prompt, no output text): arrival time, prompt length, max tokens, the sampling
settings that change the work (``n``, ``ignore_eos``, whether stop conditions were set), and
how it ended (output length reached, finish reason, prefix-cache hits).

It is fed the recorder's ``W`` records (``collector.channel.codec``), one ``WorkloadBatch`` a
read of a ring: each request's ``WorkloadArrival`` (arrival time, prompt length, max tokens,
``n``, ``ignore_eos``, ``has_stop``) and ``WorkloadEnd`` (time, output length, finish reason,
cached tokens), None where the recorder did not know.

Bounded twice: at most ``max_requests`` requests (the oldest go first), and a request that
ended more than ``max_age_s`` before the newest record is dropped. A request still in flight
is never dropped for its age: a long request that is running at the fault is part of the load
that broke the engine. Both kinds of drop are counted and exported, so a plan can say that it
does not start at the beginning of the load.

``export`` reads the log's state and changes nothing (no clock): the requests in flight at some time in
``[fault_ts - max_age_s, fault_ts]``, columnar, with times as offsets from the first kept
arrival, each request's outcome at the fault, and the concurrency over time.

An engine that died ends its requests without end records. An export with ``crashed`` therefore
counts the requests still open at the fault as failed by the crash; ingest tells the log of the
death when it routes the crash to the engine (``died``), which closes them, and a later export
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

from array import array
from collections import Counter, OrderedDict
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd

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


_NONE = -(1 << 63)  # an unknown integer in the integer columns
_NAN = float("nan")  # an unknown time in the float columns


def _opt(v: int) -> int | None:
    return None if v == _NONE else v


def _opt_bool(v: int) -> bool | None:
    return None if v < 0 else bool(v)


class WorkloadLog:
    """The requests in arrival order as columns (``array``s of numbers, lists of the ids and
    finish reasons): about 110 bytes a request held, where an object per request took ~500 (the
    log holds up to 10,000 requests per engine: 80,000 at a node of 8).

    Requests leave only from the front (the oldest arrival first), so the columns are cut from
    the front in bulk once half of them are gone, not on every drop."""

    def __init__(self, *, max_requests: int = DEFAULT_MAX_REQUESTS, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        if max_requests < 0 or max_age_s <= 0:
            raise ValueError("max_requests must be 0 (keep nothing) or more, max_age_s positive")
        self.max_requests = max_requests
        self.max_age_s = float(max_age_s)
        # request i (a sequence number: a client may reuse a request id once the first has
        # ended) sits at column position i - self._base; positions below self._head are gone
        self._base = 0
        self._head = 0
        self._id: list[str] = []
        self._engine: list[str] = []
        self._arrival = array("d")
        self._prompt_len = array("q")
        self._max_tokens = array("q")
        self._n = array("q")
        self._ignore_eos = array("b")
        self._has_stop = array("b")
        self._end = array("d")  # NaN: no end yet
        self._output_len = array("q")
        self._finish: list[str | None] = []
        self._cached = array("q")
        self._names: dict[str, str] = {}  # one copy of each engine name and finish reason
        self._open: dict[tuple[str, str], int] = {}  # (engine, id) of requests without an end
        self._early_ends: OrderedDict[tuple[str, str], WorkloadEnd] = OrderedDict()
        self._newest = float("-inf")
        self._deaths: list[float] = []
        self.dropped_by_count = 0
        self.dropped_by_age = 0
        self.ends_without_arrival = 0

    def __len__(self) -> int:
        return len(self._id) - self._head

    def open_since(self, ts: float) -> tuple[int, float | None]:
        """Requests the API server accepted after ``ts`` that have not ended, and the first one's
        arrival: what an engine holds before its first step reports it (the wedge watch)."""
        count, first = 0, None
        arrival, base = self._arrival, self._base
        for seq in self._open.values():
            at = arrival[seq - base]
            if at > ts:
                count += 1
                first = at if first is None or at < first else first
        return count, first

    def _intern(self, name: str) -> str:
        return self._names.setdefault(name, name) if len(self._names) < 4096 else name

    def add(self, batch: WorkloadBatch) -> None:
        """One read's arrivals and ends, in the order the recorder wrote them."""
        if not self.max_requests:  # the log is turned off (workload_requests: 0)
            return
        engine = self._intern(batch.engine)
        if batch.ts > self._newest:
            self._newest = batch.ts
        for rec in batch.records:
            if type(rec) is WorkloadArrival:
                self._arrive(engine, rec)
            else:
                assert isinstance(rec, WorkloadEnd)
                self._end_of((engine, rec.request_id), rec)
        self._prune()

    def _arrive(self, engine: str, rec: WorkloadArrival) -> None:
        rid, ts, prompt_len, max_tokens, n, ignore_eos, has_stop = rec
        key = (engine, rid)
        self._id.append(rid)
        self._engine.append(engine)
        self._arrival.append(ts)
        self._prompt_len.append(_NONE if prompt_len is None else prompt_len)
        self._max_tokens.append(_NONE if max_tokens is None else max_tokens)
        self._n.append(_NONE if n is None else n)
        self._ignore_eos.append(-1 if ignore_eos is None else ignore_eos)
        self._has_stop.append(-1 if has_stop is None else has_stop)
        self._end.append(_NAN)
        self._output_len.append(_NONE)
        self._finish.append(None)
        self._cached.append(_NONE)
        self._open[key] = self._base + len(self._id) - 1
        if self._early_ends:
            early = self._early_ends.pop(key, None)
            if early is not None:
                self._end_of(key, early)

    def _end_of(self, key: tuple[str, str], rec: WorkloadEnd) -> None:
        seq = self._open.pop(key, None)
        if seq is None or seq - self._base < self._head:
            # the arrival may still be on its way (another ring), or before the log began
            self._early_ends[key] = rec
            if len(self._early_ends) > MAX_EARLY_ENDS:
                self._early_ends.popitem(last=False)
                self.ends_without_arrival += 1
            return
        i = seq - self._base
        self._end[i] = rec.ts
        self._output_len[i] = _NONE if rec.output_len is None else rec.output_len
        finish = rec.finish
        self._finish[i] = self._intern(finish) if finish is not None else None
        self._cached[i] = _NONE if rec.cached_tokens is None else rec.cached_tokens

    def _drop_first(self) -> None:
        i = self._head
        key = (self._engine[i], self._id[i])
        if self._open.get(key) == self._base + i:  # still open, or closed by a crash, never by its end
            del self._open[key]
        self._head += 1

    def _prune(self) -> None:
        while len(self) > self.max_requests:
            self._drop_first()
            self.dropped_by_count += 1
        horizon = self._newest - self.max_age_s
        # ended requests are dropped from the oldest arrival on, stopping at the first one that
        # is still needed: the log stays ordered by arrival, a cheap check per record
        end = self._end
        while self._head < len(self._id):
            e = end[self._head]
            if e != e or e >= horizon:  # NaN: not ended
                break
            self._drop_first()
            self.dropped_by_age += 1
        if self._head > 1024 and self._head * 2 > len(self._id):
            self._compact()

    def _compact(self) -> None:
        h = self._head
        for col in (
            self._id,
            self._engine,
            self._arrival,
            self._prompt_len,
            self._max_tokens,
            self._n,
            self._ignore_eos,
            self._has_stop,
            self._end,
            self._output_len,
            self._finish,
            self._cached,
        ):
            del col[:h]
        self._base += h
        self._head = 0

    def export(self, fault_ts: float, *, crashed: bool, engine: str | None = None) -> dict[str, Any]:
        """The workload up to ``fault_ts`` (of one engine when ``engine`` is given).

        A request that arrived but had not ended at ``fault_ts`` failed by the crash when the
        engine died (``crashed``), else it was in flight when the snapshot was taken. An end
        recorded after ``fault_ts`` is ignored for the same reason: at the fault it had not
        ended.

        Computed on the columns (numpy over copies of the ``array``s), with Python per request
        only where a list of the export is made: 10,000 requests in a few milliseconds on the
        event loop, where a loop over the requests took ~30 (``bench/bench_workload.py``)."""
        start = fault_ts - self.max_age_s
        cutoff = fault_ts + DEATH_GRACE_S if crashed else fault_ts
        # a death starts the log afresh for a later fault, not for its own: ingest records a
        # death for each crash event routed to the engine, and one incident's events are stamped
        # up to seconds apart (an Xid, the workers' errors, a log line to the second), while a
        # restarted engine takes longer than DEATH_GRACE_S to serve again
        died_before = max((d for d in self._deaths if d < fault_ts - DEATH_GRACE_S), default=None)
        after = died_before + DEATH_GRACE_S if died_before is not None else None
        h = self._head
        arrival = _floats(self._arrival, h)
        end = _floats(self._end, h)
        mine = np.ones(len(arrival), dtype=bool)
        if engine is not None:
            mine = np.array(self._engine[h:], dtype=object) == engine
        keep = mine & (arrival <= cutoff) & (np.isnan(end) | (end >= start))
        if after is not None:
            keep &= arrival > after
        after_fault = int(np.count_nonzero(mine & (arrival > cutoff)))
        rel = np.flatnonzero(keep)  # positions from the head
        arrival_k, end_k = arrival[rel], end[rel]
        t0 = float(arrival_k.min()) if len(rel) else fault_ts
        finish_k = _pick(self._finish, rel, h)
        done = ~np.isnan(end_k) & (end_k <= cutoff) & (np.array(finish_k, dtype=object) != CRASH_FINISH)
        last = max(fault_ts, float(end_k[done].max()) if done.any() else fault_ts, float(arrival_k.max()) if len(rel) else fault_ts)
        open_outcome = "failed_by_crash" if crashed else "in_flight"
        by_finish = {f: _outcome(f) for f in set(finish_k)}
        outcome = [by_finish[f] if d else open_outcome for f, d in zip(finish_k, done.tolist(), strict=True)]
        counts = dict.fromkeys(OUTCOMES, 0)
        counts.update(Counter(outcome))
        arrival_offset = _round6(arrival_k - t0)
        end_offset = _masked(_round6_array(end_k - t0), done)
        cols: dict[str, list[Any]] = {
            "id": _pick(self._id, rel, h),
            "arrival_offset": arrival_offset,
            "prompt_len": _ints(self._prompt_len, rel, h),
            "max_tokens": _ints(self._max_tokens, rel, h),
            "n": _ints(self._n, rel, h),
            "ignore_eos": _bools(self._ignore_eos, rel, h),
            "has_stop": _bools(self._has_stop, rel, h),
            "end_offset": end_offset,
            "output_len": _ints(self._output_len, rel, h, done),
            "finish": _masked(np.array(finish_k, dtype=object), done),
            "outcome": outcome,
            "cached_tokens": _ints(self._cached, rel, h, done),
        }
        return {
            "schema": SCHEMA,
            "fault_ts": fault_ts,
            "crashed": crashed,
            "t0": t0,
            "window": {
                "start": max(start, t0) if len(rel) else start,
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
            "counts": {"requests": len(rel), **counts},
            "requests": {"columns": cols},
            "concurrency": concurrency_series(arrival_offset, end_offset, round(last - t0, 6)),
        }

    def died(self, ts: float) -> None:
        """The engine died at ``ts`` (ingest routed it a crash): what was open and had arrived by
        then (``DEATH_GRACE_S`` after, as an export counts it) ends there, failed by the crash,
        and a later export starts after this death. A request's own end, read late, replaces
        the crash's."""
        h = self._head
        arrival, end = _floats(self._arrival, h), _floats(self._end, h)
        for i in (np.flatnonzero(np.isnan(end) & (arrival <= ts + DEATH_GRACE_S)) + h).tolist():
            self._end[i], self._finish[i] = ts + DEATH_GRACE_S, CRASH_FINISH
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


def _floats(col: array[float], head: int) -> npt.NDArray[np.float64]:
    """A copy of a float column from ``head`` (a view would pin the ``array``: it could not grow)."""
    return np.frombuffer(col, dtype=np.float64)[head:].copy()


def _pick(col: list[Any], rel: npt.NDArray[np.intp], head: int) -> list[Any]:
    """The items of a list column at ``rel`` (positions from ``head``)."""
    if not len(rel):
        return []
    return list(itemgetter(*(rel + head).tolist())(col)) if len(rel) > 1 else [col[int(rel[0]) + head]]


def _ints(col: array[int], rel: npt.NDArray[np.intp], head: int, where: npt.NDArray[np.bool_] | None = None) -> list[int | None]:
    """An integer column at ``rel`` as a list, None where unknown (or not ``where``)."""
    values = np.frombuffer(col, dtype=np.int64)[head:][rel]
    unknown = values == _NONE
    if where is not None:
        unknown |= ~where
    out: list[int | None] = values.tolist()
    for i in np.flatnonzero(unknown).tolist():
        out[i] = None
    return out


_BOOL_OF = np.array([None, False, True], dtype=object)  # -1 (unknown), 0, 1


def _bools(col: array[int], rel: npt.NDArray[np.intp], head: int) -> list[bool | None]:
    values = np.frombuffer(col, dtype=np.int8)[head:][rel].astype(np.intp) + 1
    out: list[bool | None] = _BOOL_OF[values].tolist()
    return out


def _round6_array(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``round(v, 6)`` of each value, as Python rounds (correctly, from the decimal): numpy's
    ``round`` scales and may pick the other neighbour of a value within an ulp of a half, so
    those few are rounded by Python."""
    out = np.round(values, 6)
    scaled = values * 1e6
    near_half = np.flatnonzero(np.abs(scaled - np.floor(scaled) - 0.5) < 1e-3)
    for i in near_half.tolist():
        out[i] = round(float(values[i]), 6)
    return out


def _round6(values: npt.NDArray[np.float64]) -> list[float]:
    out: list[float] = _round6_array(values).tolist()
    return out


def _masked(values: npt.NDArray[Any], where: npt.NDArray[np.bool_]) -> list[Any]:
    """``values`` as a list, None where not ``where``."""
    out = values.astype(object)
    out[~where] = None
    result: list[Any] = out.tolist()
    return result


def concurrency_series(arrivals: list[float], ends: list[float | None], until: float) -> list[list[float]]:
    """``[[offset, in_flight], ...]`` at every change, ends before arrivals at the same time
    (a closed-loop client sends the next request when the last one returns). A request with no
    end stays in flight until ``until``, where the series closes."""
    ended = [e for e in ends if e is not None]
    times = np.array(arrivals + ended, dtype=np.float64)
    deltas = np.concatenate((np.ones(len(arrivals), dtype=np.int64), np.full(len(ended), -1, dtype=np.int64)))
    order = np.lexsort((deltas, times))  # by time, an end (-1) before an arrival at the same time
    times, levels = times[order], np.cumsum(deltas[order])
    # one point per time: the level after its last change
    last_of_time = np.ones(len(times), dtype=bool)
    last_of_time[:-1] = times[1:] != times[:-1]
    points = np.empty((int(np.count_nonzero(last_of_time)), 2), dtype=object)  # Python floats and ints, made in C
    points[:, 0] = times[last_of_time].tolist()
    points[:, 1] = levels[last_of_time].tolist()
    out: list[list[float]] = points.tolist()
    if out and out[-1][0] < until:
        out.append([until, out[-1][1]])
    return out
