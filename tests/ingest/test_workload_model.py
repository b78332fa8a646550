"""The columnar workload log against a simple reference (an object per request, kept in an
ordered dict, exported by a loop over the requests), on random interleavings of arrivals,
ends, engine deaths and exports, filed in random ring reads; and on a full log like the
bench's. The two must export the same JSON, byte for byte."""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.ingest import workload as workload_module
from collector.ingest.workload import (
    CRASH_FINISH,
    DEATH_GRACE_S,
    MAX_DEATHS,
    MAX_EARLY_ENDS,
    OUTCOMES,
    SCHEMA,
    WorkloadLog,
)
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd


@dataclass(slots=True)
class Request:
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


def outcome_of(finish: str | None) -> str:
    if finish is None:
        return "finished"
    f = finish.lower()
    if f in ("aborted", "abort", "cancelled") or "abort" in f:
        return "aborted"
    return "error" if f == "error" else "finished"


class Reference:
    """The workload log as it reads in its module's docstring, one record per request."""

    def __init__(self, *, max_requests: int, max_age_s: float) -> None:
        self.max_requests, self.max_age_s = max_requests, max_age_s
        self.requests: OrderedDict[int, Request] = OrderedDict()  # by sequence number
        self.open: dict[tuple[str, str], int] = {}
        self.early_ends: OrderedDict[tuple[str, str], WorkloadEnd] = OrderedDict()
        self.seq = 0
        self.newest = float("-inf")
        self.deaths: list[float] = []
        self.dropped_by_count = self.dropped_by_age = self.ends_without_arrival = 0

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, batch: WorkloadBatch) -> None:
        if not self.max_requests:
            return
        self.newest = max(self.newest, batch.ts)
        for rec in batch.records:
            key = (batch.engine, rec.request_id)
            if isinstance(rec, WorkloadArrival):
                self.seq += 1
                self.requests[self.seq] = Request(rec.request_id, batch.engine, rec.ts, *rec[2:])
                self.open[key] = self.seq
                early = self.early_ends.pop(key, None)
                if early is not None:
                    self.end(key, early)
            else:
                self.end(key, rec)
        while len(self.requests) > self.max_requests:
            self.drop()
            self.dropped_by_count += 1
        while self.requests:
            first = next(iter(self.requests.values()))
            if first.end is None or first.end >= self.newest - self.max_age_s:
                break
            self.drop()
            self.dropped_by_age += 1

    def end(self, key: tuple[str, str], rec: WorkloadEnd) -> None:
        seq = self.open.pop(key, None)
        req = self.requests.get(seq) if seq is not None else None
        if req is None:
            self.early_ends[key] = rec
            if len(self.early_ends) > MAX_EARLY_ENDS:
                self.early_ends.popitem(last=False)
                self.ends_without_arrival += 1
            return
        req.end, req.output_len, req.finish, req.cached_tokens = rec.ts, rec.output_len, rec.finish, rec.cached_tokens

    def drop(self) -> None:
        seq, req = self.requests.popitem(last=False)
        if self.open.get((req.engine, req.id)) == seq:
            del self.open[(req.engine, req.id)]

    def died(self, ts: float) -> None:
        for req in self.requests.values():
            if req.end is None and req.arrival <= ts + DEATH_GRACE_S:
                req.end, req.finish = ts + DEATH_GRACE_S, CRASH_FINISH
        if ts not in self.deaths:
            self.deaths = sorted([*self.deaths, ts])[-MAX_DEATHS:]

    def open_since(self, ts: float) -> tuple[int, float | None]:
        at = [self.requests[seq].arrival for seq in self.open.values() if self.requests[seq].arrival > ts]
        return len(at), min(at, default=None)

    def export(self, fault_ts: float, *, crashed: bool, engine: str | None = None) -> dict[str, Any]:
        start = fault_ts - self.max_age_s
        cutoff = fault_ts + DEATH_GRACE_S if crashed else fault_ts
        died_before = max((d for d in self.deaths if d < fault_ts - DEATH_GRACE_S), default=None)
        mine = [r for r in self.requests.values() if engine is None or r.engine == engine]
        kept = [
            r
            for r in mine
            if r.arrival <= cutoff and (r.end is None or r.end >= start) and (died_before is None or r.arrival > died_before + DEATH_GRACE_S)
        ]
        t0 = min((r.arrival for r in kept), default=fault_ts)
        cols: dict[str, list[Any]] = {c: [] for c in workload_module.COLUMNS}
        counts = dict.fromkeys(OUTCOMES, 0)
        last = fault_ts
        for r in kept:
            ended = r.end is not None and r.end <= cutoff and r.finish != CRASH_FINISH
            outcome = outcome_of(r.finish) if ended else ("failed_by_crash" if crashed else "in_flight")
            counts[outcome] += 1
            last = max(last, r.arrival, r.end if ended and r.end is not None else last)
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
            for c, v in row.items():
                cols[c].append(v)
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
                "ends_without_arrival": self.ends_without_arrival + len(self.early_ends),
                "arrived_after_fault": sum(1 for r in mine if r.arrival > cutoff),
            },
            "counts": {"requests": len(kept), **counts},
            "requests": {"columns": cols},
            "concurrency": concurrency(cols["arrival_offset"], cols["end_offset"], round(last - t0, 6)),
        }


def concurrency(arrivals: list[float], ends: list[float | None], until: float) -> list[list[float]]:
    changes = sorted([(a, 1) for a in arrivals] + [(e, -1) for e in ends if e is not None])
    out: list[list[float]] = []
    level = 0
    for t, delta in changes:
        level += delta
        if out and out[-1][0] == t:
            out[-1] = [t, level]  # the time as its last change has it (-0.0 and 0.0 are one time)
        else:
            out.append([t, level])
    if out and out[-1][0] < until:
        out.append([until, level])
    return out


def same(log: WorkloadLog, ref: Reference, fault_ts: float, crashed: bool, engine: str | None = None) -> None:
    got, want = log.export(fault_ts, crashed=crashed, engine=engine), ref.export(fault_ts, crashed=crashed, engine=engine)
    assert json.dumps(got) == json.dumps(want)
    assert got == want


IDS = ("a", "b", "c", "d", "e", "f")
FINISHES = (None, "stop", "length", "abort", "aborted", "Cancelled", "error", "timeout", "x")
count = st.one_of(st.none(), st.integers(0, 40_000), st.integers(0, 2**63 - 1))
flag = st.one_of(st.none(), st.booleans())


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Arrivals and ends of a few request ids (reused) on two engines, times moving forward
    with jitter (an end may come before its arrival, records out of order), now and then an
    engine death or an export."""
    clock = 1_765_000_000.0
    out: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 120))):
        clock += draw(st.sampled_from([0.0, 0.000_000_5, 0.1, 1.3, 7.0, 40.0]))
        ts = clock + draw(st.sampled_from([0.0, -0.25, 0.123_456_75, -3.000_000_5]))
        engine = draw(st.sampled_from(["decode-0", "decode-0", "decode-1"]))
        kind = draw(st.sampled_from(["arrive", "arrive", "end", "end", "died", "export"]))
        if kind == "arrive":
            out.append((kind, engine, WorkloadArrival(draw(st.sampled_from(IDS)), ts, draw(count), draw(count), draw(count), draw(flag), draw(flag))))
        elif kind == "end":
            out.append((kind, engine, WorkloadEnd(draw(st.sampled_from(IDS)), ts, draw(count), draw(st.sampled_from(FINISHES)), draw(count))))
        elif kind == "died":
            out.append((kind, ts))
        else:
            out.append(
                (
                    kind,
                    ts + draw(st.sampled_from([0.0, 2.0, -10.0])),
                    draw(st.booleans()),
                    draw(st.sampled_from([None, "decode-0", "decode-1", "other"])),
                )
            )
    return out


@settings(max_examples=300, deadline=None)
@given(
    operations(),
    st.sampled_from([0, 1, 3, 10, 1000]),
    st.sampled_from([5.0, 60.0, 3600.0]),
    st.data(),
)
def test_the_columnar_log_exports_what_the_reference_does(
    ops: list[tuple[Any, ...]], max_requests: int, max_age_s: float, data: st.DataObject
) -> None:
    log, ref = WorkloadLog(max_requests=max_requests, max_age_s=max_age_s), Reference(max_requests=max_requests, max_age_s=max_age_s)
    pending: list[WorkloadArrival | WorkloadEnd] = []
    pending_engine = ""

    def flush() -> None:
        if pending:
            batch = WorkloadBatch(engine=pending_engine, ts=max(r.ts for r in pending), records=list(pending))
            log.add(batch)
            ref.add(batch)
            pending.clear()

    with pytest.MonkeyPatch.context() as mp:
        # small columns and a small table of names: the columns move and grow, the names are forgotten
        mp.setattr(workload_module, "MIN_ROWS", data.draw(st.sampled_from([1, 4, 64])))
        mp.setattr(workload_module, "MAX_NAMES", data.draw(st.sampled_from([3, 4096])))
        for op in ops:
            if op[0] in ("arrive", "end"):
                # records of one engine go into one ring read until a read is cut
                if pending and (op[1] != pending_engine or data.draw(st.booleans())):
                    flush()
                pending_engine = op[1]
                pending.append(op[2])
                continue
            flush()
            if op[0] == "died":
                log.died(op[1])
                ref.died(op[1])
            else:
                same(log, ref, op[1], op[2], op[3])
                assert log.open_since(op[1] - 30.0) == ref.open_since(op[1] - 30.0)
        flush()
        assert len(log) == len(ref)
        end = ref.newest if ref.newest > float("-inf") else 1_765_000_000.0
        for crashed in (False, True):
            same(log, ref, end, crashed)
            same(log, ref, end - 20.0, crashed, "decode-0")


def bench_like(requests: int, seed: int) -> tuple[list[WorkloadBatch], float]:
    """Requests as bench/bench_workload.py files them: arrivals in reads of 64, two thirds
    ended, ids as vLLM's, a few finish reasons."""
    rng = random.Random(seed)
    t = 1_765_000_000.0
    reads, batch, ends = [], [], []
    for i in range(requests):
        t += rng.random() * 0.02
        rid = f"cmpl-{i:08x}-0-{rng.getrandbits(32):08x}"
        batch.append(WorkloadArrival(rid, t, rng.randint(100, 32_000), rng.choice((16, 2000, None)), 1, rng.random() < 0.5, None))
        if rng.random() < 0.66:
            ends.append(WorkloadEnd(rid, t + rng.random() * 5, rng.randint(1, 2000), rng.choice(("stopped", "length", "aborted", None)), 0))
        if len(batch) >= 64:
            reads.append(WorkloadBatch(engine="decode-0", ts=t, records=batch))
            batch = []
    ends.sort(key=lambda e: e.ts)
    reads.append(WorkloadBatch(engine="decode-0", ts=t, records=batch + [e for e in ends if e.ts <= t]))
    return reads, t


@pytest.mark.parametrize(("requests", "max_requests"), [(3000, 10_000), (3000, 1000)])
def test_a_full_log_exports_what_the_reference_does(requests: int, max_requests: int) -> None:
    reads, t = bench_like(requests, seed=requests + max_requests)
    log, ref = WorkloadLog(max_requests=max_requests), Reference(max_requests=max_requests, max_age_s=workload_module.DEFAULT_MAX_AGE_S)
    for batch in reads:
        log.add(batch)
        ref.add(batch)
    for fault_ts in (t, t - 7.5, t - 40.0):
        for crashed in (False, True):
            same(log, ref, fault_ts, crashed)
    assert log.export(t, crashed=True)["counts"]["requests"] == min(requests, max_requests)
    log.died(t - 10.0)
    ref.died(t - 10.0)
    for fault_ts in (t - 10.0, t + 60.0):
        same(log, ref, fault_ts, True)
