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

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from collector.channel.work_columns import WorkColumns
from collector.columns import INT64_NULL
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd

SCHEMA = "flightrec.workload/v1"
DEFAULT_MAX_REQUESTS = 10_000
DEFAULT_MAX_AGE_S = 3600.0
MAX_EARLY_ENDS = 1024  # ends held for an arrival not yet read (the two records may cross)
MAX_DEATHS = 64  # engine deaths remembered (each starts the log afresh)
MAX_NAMES = 4096  # engine names and finish reasons held before the unused ones are forgotten
MIN_ROWS = 64  # the columns' first length
DEATH_GRACE_S = 5.0
CRASH_FINISH = "\0engine_died"  # the end a crash gives open requests (no recorder writes it: no NUL)

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

_NONE = INT64_NULL  # an unknown integer in the integer columns
_NAN = float("nan")  # an unknown time in the float columns
_OUTCOME_CODE = {name: i for i, name in enumerate(OUTCOMES)}
_OUTCOME_OF = np.array(OUTCOMES, dtype=object)
_BOOL_OF = np.array([None, False, True], dtype=object)  # -1 (unknown), 0, 1
_CRASH = 1  # CRASH_FINISH's code in the finish column (0: no finish)


class _Names:
    """Codes for a column of strings (engine names, finish reasons): code 0 is None, then the
    ``fixed`` names, then each new string the next code. ``objects`` maps codes to the strings
    as an object array, so that an export's list of them is made in C; ``outcomes`` maps a
    finish reason's code to its outcome's. Both are made when a name comes (an export reads
    them and writes nothing)."""

    def __init__(self, *fixed: str) -> None:
        self.names: list[str | None] = [None, *fixed]
        self.codes: dict[str, int] = {name: i for i, name in enumerate(fixed, 1)}
        self.fixed = len(self.names)
        self.outcomes = np.full(self.fixed, _OUTCOME_CODE["finished"], dtype=np.intp)
        self.objects = np.array(self.names, dtype=object)

    def __len__(self) -> int:
        return len(self.names)

    def code(self, name: str | None) -> int:
        if name is None:
            return 0
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
            self.outcomes = np.append(self.outcomes, _OUTCOME_CODE[_outcome(name)])
            self.objects = np.array(self.names, dtype=object)
        return code

    def keep_only(self, used: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
        """Forget the names no row holds (``used``: the rows' codes); returns the map of old
        codes to new ones, for the rows."""
        remap = np.arange(len(self.names), dtype=np.int32)
        names, codes = self.names[: self.fixed], {n: c for n, c in self.codes.items() if c < self.fixed}
        kept = [c for c in np.unique(used).tolist() if c >= self.fixed]
        for old in kept:
            name = self.names[old]
            assert name is not None
            remap[old] = codes[name] = len(names)
            names.append(name)
        self.outcomes = self.outcomes[np.r_[np.arange(self.fixed), np.array(kept, dtype=np.intp)]]
        self.names, self.codes, self.objects = names, codes, np.array(names, dtype=object)
        return remap


class WorkloadLog:
    """The requests in arrival order as numpy columns, one array per field (the ids an object
    array, engine names and finish reasons as codes): 82 bytes a row besides the id's string,
    up to 10,000 requests per engine. One ring read's records are filed with one slice
    assignment per column; an export is computed on the columns, with Python only where the
    export's lists are made.

    Request ``seq`` (a sequence number: a client may reuse a request id once the first has
    ended) sits at position ``seq - _base``; the rows ``[_head, _tail)`` are held. Requests
    leave only from the front (the oldest arrival first): ``_head`` moves, and the held rows
    move back to the start of the columns when the end is reached, so that the columns grow
    only to about 1.5 times the most requests held."""

    def __init__(self, *, max_requests: int = DEFAULT_MAX_REQUESTS, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        if max_requests < 0 or max_age_s <= 0:
            raise ValueError("max_requests must be 0 (keep nothing) or more, max_age_s positive")
        self.max_requests = max_requests
        self.max_age_s = float(max_age_s)
        self._base = 0
        self._head = 0
        self._tail = 0
        self._alloc(0)
        self._engines = _Names()
        self._finishes = _Names(CRASH_FINISH)
        self._open: dict[tuple[str, str], int] = {}  # (engine, id) -> seq of requests without an end
        self._early_ends: OrderedDict[tuple[str, str], WorkloadEnd] = OrderedDict()
        self._newest = float("-inf")
        self._deaths: list[float] = []
        self.dropped_by_count = 0
        self.dropped_by_age = 0
        self.ends_without_arrival = 0

    def _alloc(self, capacity: int) -> None:
        self._id = np.empty(capacity, dtype=object)
        self._engine = np.zeros(capacity, dtype=np.int32)
        self._arrival = np.empty(capacity, dtype=np.float64)
        self._prompt_len = np.empty(capacity, dtype=np.int64)
        self._max_tokens = np.empty(capacity, dtype=np.int64)
        self._n = np.empty(capacity, dtype=np.int64)
        self._ignore_eos = np.empty(capacity, dtype=np.int8)  # -1 unknown, 0, 1
        self._has_stop = np.empty(capacity, dtype=np.int8)
        self._end = np.empty(capacity, dtype=np.float64)  # NaN: no end yet
        self._output_len = np.empty(capacity, dtype=np.int64)
        self._finish = np.zeros(capacity, dtype=np.int32)  # a code of self._finishes
        self._cached = np.empty(capacity, dtype=np.int64)

    def _columns(self) -> tuple[npt.NDArray[Any], ...]:
        return (
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
        )

    def __len__(self) -> int:
        return self._tail - self._head

    def open_since(self, ts: float) -> tuple[int, float | None]:
        """Requests the API server accepted after ``ts`` that have not ended, and the first one's
        arrival: what an engine holds before its first step reports it (the wedge watch)."""
        if not self._open:
            return 0, None
        seqs = np.fromiter(self._open.values(), dtype=np.int64, count=len(self._open)) - self._base
        at = self._arrival[seqs]
        at = at[at > ts]
        return len(at), (float(at.min()) if len(at) else None)

    def add(self, batch: WorkloadBatch) -> None:
        """One read's arrivals and ends, in the order the recorder wrote them."""
        if not self.max_requests:  # the log is turned off (workload_requests: 0)
            return
        engine = batch.engine
        if batch.ts > self._newest:
            self._newest = batch.ts
        if type(batch.records) is WorkColumns and self._add_columns(engine, batch.records):
            self._prune()
            return
        arrivals: list[WorkloadArrival] = []
        ends: list[tuple[int, WorkloadEnd]] = []  # (seq, end) to file once the arrivals are
        first = self._base + self._tail
        opened, early_ends = self._open, self._early_ends
        for rec in batch.records:
            if type(rec) is WorkloadArrival:
                key = (engine, rec.request_id)
                opened[key] = first + len(arrivals)
                arrivals.append(rec)
                if early_ends:
                    early = early_ends.pop(key, None)
                    if early is not None:
                        self._end_of(key, early, ends)
            else:
                assert isinstance(rec, WorkloadEnd)
                self._end_of((engine, rec.request_id), rec, ends)
        if arrivals:
            self._file_arrivals(engine, arrivals)
        if ends:
            self._file_ends(ends)
        self._prune()

    def _add_columns(self, engine: str, cols: WorkColumns) -> bool:
        """``add`` for a ring read's columns, filed column by column; False (nothing done) where
        the records' order matters: a request id that arrives twice in the read, or whose end
        comes before its arrival (``add`` files those one by one, in order)."""
        is_end, ids = cols.is_end, cols.ids
        end_at = np.flatnonzero(is_end).tolist()
        if end_at:
            arrive_at = np.flatnonzero(~is_end).tolist()
            arriving = [ids[i] for i in arrive_at]
            ending = [ids[i] for i in end_at]
        else:
            arrive_at, arriving, ending = [], ids, []
        unique = set(arriving)
        if len(unique) != len(arriving):
            return False
        if ending:
            both = unique.intersection(ending)
            if both:
                arrived = {rid: i for i, rid in zip(arrive_at, arriving, strict=True) if rid in both}
                if any(rid in both and i < arrived[rid] for i, rid in zip(end_at, ending, strict=True)):
                    return False
        opened, early_ends = self._open, self._early_ends
        k = len(arriving)
        keys = [(engine, rid) for rid in arriving]
        first = self._base + self._tail
        opened.update(zip(keys, range(first, first + k), strict=True))
        ends: list[tuple[int, WorkloadEnd]] = []
        if early_ends:
            for key in early_ends.keys() & set(keys):
                self._end_of(key, early_ends.pop(key), ends)
        if k:
            self._reserve(k)
            at = slice(self._tail, self._tail + k)
            rows = arrive_at if ending else slice(None)
            self._id[at] = arriving
            self._engine[at] = self._engines.code(engine)
            self._arrival[at] = cols.ts[rows]
            self._prompt_len[at] = cols.a[rows]
            self._max_tokens[at] = cols.b[rows]
            self._n[at] = cols.c[rows]
            self._ignore_eos[at] = cols.f1[rows]
            self._has_stop[at] = cols.f2[rows]
            self._end[at] = _NAN
            self._output_len[at] = _NONE
            self._finish[at] = 0
            self._cached[at] = _NONE
            self._tail += k
        if ends:
            self._file_ends(ends)
        if ending:
            seqs: list[int] = []
            rows_of: list[int] = []
            base, head = self._base, self._head
            for i, rid in zip(end_at, ending, strict=True):
                key = (engine, rid)
                seq = opened.pop(key, None)
                if seq is None or seq - base < head:
                    self._end_of(key, cast("WorkloadEnd", cols[i]), [])  # (held: its arrival may come later)
                    continue
                seqs.append(seq)
                rows_of.append(i)
            if seqs:
                pos = np.array(seqs, dtype=np.int64) - base
                self._end[pos] = cols.ts[rows_of]
                self._output_len[pos] = cols.a[rows_of]
                finish, codes, code = cols.finish, self._finishes.codes, self._finishes.code
                self._finish[pos] = [codes.get(f) or code(f) for f in map(finish.__getitem__, rows_of)]  # type: ignore[arg-type]
                self._cached[pos] = cols.b[rows_of]
        return True

    def _end_of(self, key: tuple[str, str], rec: WorkloadEnd, ends: list[tuple[int, WorkloadEnd]]) -> None:
        seq = self._open.pop(key, None)
        if seq is None or seq - self._base < self._head:
            # the arrival may still be on its way (another ring), or before the log began
            self._early_ends[key] = rec
            if len(self._early_ends) > MAX_EARLY_ENDS:
                self._early_ends.popitem(last=False)
                self.ends_without_arrival += 1
            return
        ends.append((seq, rec))

    def _file_arrivals(self, engine: str, recs: list[WorkloadArrival]) -> None:
        k = len(recs)
        self._reserve(k)
        at = slice(self._tail, self._tail + k)
        ids, ts, prompt_len, max_tokens, n, ignore_eos, has_stop = zip(*recs, strict=True)
        self._id[at] = ids
        self._engine[at] = self._engines.code(engine)
        self._arrival[at] = ts
        self._prompt_len[at] = _ints_in(prompt_len)
        self._max_tokens[at] = _ints_in(max_tokens)
        self._n[at] = _ints_in(n)
        self._ignore_eos[at] = _bools_in(ignore_eos)
        self._has_stop[at] = _bools_in(has_stop)
        self._end[at] = _NAN
        self._output_len[at] = _NONE
        self._finish[at] = 0
        self._cached[at] = _NONE
        self._tail += k

    def _file_ends(self, ends: list[tuple[int, WorkloadEnd]]) -> None:
        seqs, recs = zip(*ends, strict=True)
        pos = np.array(seqs, dtype=np.int64) - self._base
        _, ts, output_len, finish, cached = zip(*recs, strict=True)
        self._end[pos] = ts
        self._output_len[pos] = _ints_in(output_len)
        self._finish[pos] = [self._finishes.code(f) for f in finish]
        self._cached[pos] = _ints_in(cached)

    def _reserve(self, k: int) -> None:
        """Room for ``k`` more rows after ``_tail``: the held rows moved to the start when that
        leaves a quarter of the columns free, else columns half as large again as needed."""
        if self._tail + k <= len(self._arrival):
            return
        h, t = self._head, self._tail
        needed = t - h + k
        capacity = len(self._arrival)
        if needed + capacity // 4 > capacity:
            old = self._columns()
            self._alloc(max(needed + needed // 2, MIN_ROWS))
            for src, dst in zip(old, self._columns(), strict=True):
                dst[: t - h] = src[h:t]
        else:
            for col in self._columns():
                col[: t - h] = col[h:t]
            self._id[t - h : t] = None  # the ids moved or gone are not pinned
        self._base += h
        self._head, self._tail = 0, t - h
        if len(self._finishes) > MAX_NAMES:  # a recorder inventing finish reasons
            held = slice(0, self._tail)
            self._finish[held] = self._finishes.keep_only(self._finish[held])[self._finish[held]]
        if len(self._engines) > MAX_NAMES:
            held = slice(0, self._tail)
            self._engine[held] = self._engines.keep_only(self._engine[held])[self._engine[held]]

    def _drop(self, k: int) -> None:
        """The ``k`` oldest rows leave (their ``_open`` entry too, where it is still theirs)."""
        h = self._head
        gone = slice(h, h + k)
        # only a request without an end, or closed by a crash, can still be open
        maybe_open = np.flatnonzero(np.isnan(self._end[gone]) | (self._finish[gone] == _CRASH)) + h
        if len(maybe_open):
            names, opened = self._engines.names, self._open
            for i, code, rid in zip(maybe_open.tolist(), self._engine[maybe_open].tolist(), self._id[maybe_open].tolist(), strict=True):
                key = (names[code], rid)
                if opened.get(key) == self._base + i:
                    del opened[key]
        self._head = h + k

    def _prune(self) -> None:
        excess = len(self) - self.max_requests
        if excess > 0:
            self._drop(excess)
            self.dropped_by_count += excess
        horizon = self._newest - self.max_age_s
        # ended requests are dropped from the oldest arrival on, stopping at the first one that
        # is still needed (not ended, or ended within the window): the log stays ordered by arrival
        h, t = self._head, self._tail
        if h < t and self._end[h] < horizon:
            still = np.flatnonzero(~(self._end[h:t] < horizon))  # NaN: not ended
            k = int(still[0]) if len(still) else t - h
            self._drop(k)
            self.dropped_by_age += k

    def export(self, fault_ts: float, *, crashed: bool, engine: str | None = None) -> dict[str, Any]:
        """The workload up to ``fault_ts`` (of one engine when ``engine`` is given).

        A request that arrived but had not ended at ``fault_ts`` failed by the crash when the
        engine died (``crashed``), else it was in flight when the snapshot was taken. An end
        recorded after ``fault_ts`` is ignored for the same reason: at the fault it had not
        ended.

        Computed on the columns, each list of the export made in C from an array
        (``bench/bench_workload.py``: 10,000 requests in a few milliseconds on the event loop)."""
        start = fault_ts - self.max_age_s
        cutoff = fault_ts + DEATH_GRACE_S if crashed else fault_ts
        # a death starts the log afresh for a later fault, not for its own: ingest records a
        # death for each crash event routed to the engine, and one incident's events are stamped
        # up to seconds apart (an Xid, the workers' errors, a log line to the second), while a
        # restarted engine takes longer than DEATH_GRACE_S to serve again
        died_before = max((d for d in self._deaths if d < fault_ts - DEATH_GRACE_S), default=None)
        after = died_before + DEATH_GRACE_S if died_before is not None else None
        h, t = self._head, self._tail
        arrival = self._arrival[h:t]
        kept = (arrival <= cutoff) & ~(self._end[h:t] < start)  # NaN: not ended
        later = arrival > cutoff
        if engine is not None:
            mine = self._engine[h:t] == self._engines.codes.get(engine, -1)
            kept &= mine
            later &= mine
        if after is not None:
            kept &= arrival > after
        after_fault = int(np.count_nonzero(later))
        rows: slice | npt.NDArray[np.intp] = slice(h, t) if kept.all() else np.flatnonzero(kept) + h
        arrival_k, end_k, finish_k = self._arrival[rows], self._end[rows], self._finish[rows]
        count = len(arrival_k)
        t0 = float(arrival_k.min()) if count else fault_ts
        done = (end_k <= cutoff) & (finish_k != _CRASH)  # NaN: not ended
        last = max(fault_ts, float(end_k[done].max()) if done.any() else fault_ts, float(arrival_k.max()) if count else fault_ts)
        open_outcome = _OUTCOME_CODE["failed_by_crash" if crashed else "in_flight"]
        outcome = np.where(done, self._finishes.outcomes[finish_k], open_outcome)
        counts = dict(zip(OUTCOMES, np.bincount(outcome, minlength=len(OUTCOMES)).tolist(), strict=True))
        # the offsets as Python floats once: the columns' lists and the concurrency series share them
        arrival_offset = _round6(arrival_k - t0)
        end_offset = _round6(end_k[done] - t0)
        arrival_floats, end_floats = arrival_offset.astype(object), end_offset.astype(object)
        cols: dict[str, list[Any]] = {
            "id": self._id[rows].tolist(),
            "arrival_offset": arrival_floats.tolist(),
            "prompt_len": _ints(self._prompt_len[rows]),
            "max_tokens": _ints(self._max_tokens[rows]),
            "n": _ints(self._n[rows]),
            "ignore_eos": _BOOL_OF[self._ignore_eos[rows] + 1].tolist(),
            "has_stop": _BOOL_OF[self._has_stop[rows] + 1].tolist(),
            "end_offset": _spread(end_floats, done),
            "output_len": _ints(self._output_len[rows], done),
            "finish": self._finishes.objects[np.where(done, finish_k, 0)].tolist(),
            "outcome": _OUTCOME_OF[outcome].tolist(),
            "cached_tokens": _ints(self._cached[rows], done),
        }
        return {
            "schema": SCHEMA,
            "fault_ts": fault_ts,
            "crashed": crashed,
            "t0": t0,
            "window": {
                "start": max(start, t0) if count else start,
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
            "counts": {"requests": count, **counts},
            "requests": {"columns": cols},
            "concurrency": _concurrency(arrival_offset, end_offset, round(last - t0, 6), np.concatenate((arrival_floats, end_floats))),
        }

    def died(self, ts: float) -> None:
        """The engine died at ``ts`` (ingest routed it a crash): what was open and had arrived by
        then (``DEATH_GRACE_S`` after, as an export counts it) ends there, failed by the crash,
        and a later export starts after this death. A request's own end, read late, replaces
        the crash's."""
        h, t = self._head, self._tail
        closed = np.flatnonzero(np.isnan(self._end[h:t]) & (self._arrival[h:t] <= ts + DEATH_GRACE_S)) + h
        self._end[closed] = ts + DEATH_GRACE_S
        self._finish[closed] = _CRASH
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


def _ints_in(values: Sequence[int | None]) -> Any:
    """A record field's values for an integer column, None (unknown) as ``_NONE``."""
    return values if None not in values else [_NONE if v is None else v for v in values]


def _bools_in(values: Sequence[bool | None]) -> Any:
    """A record field's values for a flag column: -1 unknown, 0, 1."""
    return values if None not in values else [-1 if v is None else v for v in values]


def _ints(values: npt.NDArray[np.int64], where: npt.NDArray[np.bool_] | None = None) -> list[int | None]:
    """An integer column as a list, None where unknown (or not ``where``). A column of one
    value (``n``, often ``max_tokens`` or ``cached_tokens``) shares one int object."""
    unknown = values == _NONE
    if where is not None:
        unknown |= ~where
    some_unknown = bool(unknown.any())
    known = values[~unknown] if some_unknown else values
    if len(known) and known.min() == known.max():
        if not some_unknown:
            return [int(known[0])] * len(values)
        objects = np.full(len(values), int(known[0]), dtype=object)
    elif not some_unknown:
        out: list[int | None] = values.tolist()
        return out
    else:
        objects = values.astype(object)
    objects[unknown] = None
    out = objects.tolist()
    return out


def _spread(values: npt.NDArray[np.object_], where: npt.NDArray[np.bool_]) -> list[Any]:
    """``values`` (one per true of ``where``) as a list as long as ``where``, None elsewhere."""
    out = np.full(len(where), None, dtype=object)
    out[where] = values
    result: list[Any] = out.tolist()
    return result


def _round6(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``round(v, 6)`` of each value, as Python rounds (correctly, from the decimal): numpy's
    ``round`` scales and may pick the other neighbour of a value within an ulp of a half, so
    those few are rounded by Python."""
    out = np.round(values, 6)
    scaled = values * 1e6
    near_half = np.flatnonzero(np.abs(scaled - np.floor(scaled) - 0.5) < 1e-3)
    for i in near_half.tolist():
        out[i] = round(float(values[i]), 6)
    return out


def concurrency_series(arrivals: list[float], ends: list[float | None], until: float) -> list[list[float]]:
    """``[[offset, in_flight], ...]`` at every change, ends before arrivals at the same time
    (a closed-loop client sends the next request when the last one returns). A request with no
    end stays in flight until ``until``, where the series closes."""
    ended = [e for e in ends if e is not None]
    return _concurrency(np.array(arrivals, dtype=np.float64), np.array(ended, dtype=np.float64), until, np.array(arrivals + ended, dtype=object))


def _concurrency(
    arrivals: npt.NDArray[np.float64], ends: npt.NDArray[np.float64], until: float, floats: npt.NDArray[np.object_]
) -> list[list[float]]:
    """``concurrency_series`` of the arrivals' and ends' times, ``floats`` the same times as
    Python floats (arrivals then ends), which the series' points take as they are."""
    times = np.concatenate((arrivals, ends))
    deltas = np.concatenate((np.ones(len(arrivals), dtype=np.int64), np.full(len(ends), -1, dtype=np.int64)))
    order = np.lexsort((deltas, times))  # by time, an end (-1) before an arrival at the same time
    times, levels = times[order], np.cumsum(deltas[order])
    # one point per time: the level after its last change
    last_of_time = np.ones(len(times), dtype=bool)
    last_of_time[:-1] = times[1:] != times[:-1]
    at = order[last_of_time]
    points = np.empty((len(at), 2), dtype=object)  # Python floats and ints, made in C
    points[:, 0] = floats[at]
    points[:, 1] = levels[last_of_time]
    out: list[list[float]] = points.tolist()
    if out and out[-1][0] < until:
        out.append([until, out[-1][1]])
    return out
