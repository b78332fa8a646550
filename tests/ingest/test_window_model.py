"""The columnar window and its per-second aggregates against a simple reference (one record per
step, merged half by half; one fold per half), on random interleavings of halves, runs and
out-of-order steps, filed in random ring reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.columns import STEP_COLUMNS, stats_of_records, to_python
from collector.ingest import window as window_module
from collector.ingest.window import StepWindow
from collector.model import HALF_REQUESTS, HALF_STATS, StepRecord
from tests.request_columns import Row, make_block

STATS = ("running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens", "generation_tokens", "finished")


@dataclass
class Half:
    run: int
    step: int
    ts: float
    stats: dict[str, Any] | None = None  # the stats half's figures; None: a requests half
    rows: int = 0

    def record(self) -> StepRecord:
        if self.stats is not None:
            return StepRecord(engine="d", ts=self.ts, step=self.step, run=self.run, halves=HALF_STATS, **self.stats)
        block = make_block(self.step, self.ts, [Row(f"r{i}", 10, 5, status="running" if i % 3 else "waiting") for i in range(self.rows)])
        return StepRecord(engine="d", ts=self.ts, step=self.step, run=self.run, running=block.running, request_block=block, halves=HALF_REQUESTS)


@dataclass
class Ref:
    """What the window should hold: per step, the halves of its run merged in arrival order (a
    half of a newer run replaces what the step held; one of an older run is not held)."""

    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    seconds: list[dict[str, Any]] = field(default_factory=list)

    def add(self, rec: StepRecord) -> None:
        held = self.steps.get(rec.step)
        if held is not None and held["run"] > rec.run:
            self.fold(rec)
            return
        if held is None or held["run"] != rec.run:
            held = self.steps[rec.step] = {"run": rec.run, "ts": rec.ts, "halves": 0, "block": None, **dict.fromkeys(STATS)}
        if rec.halves & HALF_STATS:
            for name in STATS:
                held[name] = getattr(rec, name)
            held["ts"] = rec.ts
        else:
            held["block"] = rec.request_block
            if not held["halves"] & HALF_STATS:
                held["running"] = rec.running
        held["halves"] |= rec.halves
        self.fold(rec)

    def fold(self, rec: StepRecord) -> None:
        second = int(rec.ts)
        agg = None
        for held in reversed(self.seconds):
            if int(held["ts"]) == second:
                agg = held
                break
            if int(held["ts"]) < second:
                break
        if agg is None:
            if self.seconds and second < int(self.seconds[-1]["ts"]):
                return
            agg = {"ts": rec.ts, "step": rec.step, "halves": 0, "block": None, **dict.fromkeys(STATS)}
            self.seconds.append(agg)
        agg["ts"] = max(agg["ts"], rec.ts)
        agg["step"] = max(agg["step"], rec.step)
        if rec.halves & HALF_STATS:
            agg["halves"] |= HALF_STATS
            for name in ("running", "waiting", "kv_cache_usage"):
                if getattr(rec, name) is not None:
                    agg[name] = getattr(rec, name)
            for name in ("prompt_tokens", "generation_tokens", "preemptions", "finished"):
                if getattr(rec, name) is not None:
                    agg[name] = (agg[name] or 0) + getattr(rec, name)
        else:
            agg["halves"] |= HALF_REQUESTS
            agg["block"] = rec.request_block
            if not agg["halves"] & HALF_STATS:
                agg["running"] = rec.running


figure = st.one_of(st.none(), st.integers(0, 500))


@st.composite
def halves(draw: st.DrawFn) -> list[Half]:
    """Steps of up to two runs, each step's halves (one, the other or both) in any order, the
    steps themselves slightly out of order, timestamps over a few seconds."""
    out: list[Half] = []
    for run in draw(st.lists(st.sampled_from([100, 200]), min_size=1, max_size=2, unique=True)):
        n = draw(st.integers(1, 40))
        for step in range(n):
            ts = 1000.0 + step * draw(st.sampled_from([0.05, 0.2, 0.45]))
            kinds = draw(st.sampled_from(["stats", "reqs", "both", "both-reqs-first"]))
            stats = Half(run, step, ts + 0.001, {name: draw(figure) for name in STATS if name != "kv_cache_usage"})
            stats.stats["kv_cache_usage"] = draw(st.one_of(st.none(), st.floats(0, 1)))  # type: ignore[index]
            reqs = Half(run, step, ts, None, draw(st.integers(0, 5)))
            out += {"stats": [stats], "reqs": [reqs], "both": [stats, reqs], "both-reqs-first": [reqs, stats]}[kinds]
    # out of order: a few halves move back by up to 3 places
    for i in draw(st.lists(st.integers(0, len(out) - 1), max_size=5)):
        j = max(0, i - draw(st.integers(1, 3)))
        out.insert(j, out.pop(i))
    return out


def reads(draw: st.DrawFn, items: list[Half]) -> list[list[Half]]:
    """The halves cut into ring reads: consecutive halves of one kind and run."""
    out: list[list[Half]] = []
    for h in items:
        if out and (out[-1][0].stats is None) == (h.stats is None) and out[-1][0].run == h.run and draw(st.booleans()):
            out[-1].append(h)
        else:
            out.append([h])
    return out


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([0, 64]))
def test_the_window_and_its_seconds_agree_with_the_reference(data: st.DataObject, vector_from: int) -> None:
    # both ways of folding a read's stats halves: with reductions per second, and row by row
    default = window_module.FOLD_VECTOR_FROM
    window_module.FOLD_VECTOR_FROM = vector_from
    try:
        _check(data)
    finally:
        window_module.FOLD_VECTOR_FROM = default


def _check(data: st.DataObject) -> None:
    items = data.draw(halves())
    window = StepWindow("d", 4096)
    ref = Ref()
    for chunk in reads(data.draw, items):
        recs = [h.record() for h in chunk]
        for rec in recs:
            ref.add(rec)
        run = chunk[0].run
        if chunk[0].stats is not None:
            rows, extras = stats_of_records(recs)
            window.file_stats(run, rows, extras, 0.0)
        else:
            window.file_blocks(run, [r.request_block for r in recs if r.request_block is not None], 0.0)
    held = {(r.run, r.step): r for r in window.steps()}
    assert set(held) == {(want["run"], step) for step, want in ref.steps.items()}
    for (run, step), rec in held.items():
        want = ref.steps[step]
        assert rec.halves == want["halves"]
        assert rec.ts == want["ts"]
        for name in STATS:
            assert getattr(rec, name) == want[name], (name, run, step)
        assert rec.request_block is want["block"]
    # the seconds
    got = window.seconds.all()
    assert len(got) == len(ref.seconds)
    for rec, want in zip(got, ref.seconds, strict=True):
        assert (rec.ts, rec.step, rec.halves) == (want["ts"], want["step"], want["halves"])
        for name in STATS:
            assert getattr(rec, name) == want[name], name
        assert rec.request_block is want["block"]
    # every held step goes to storage once, merged, in (run, step) order; a step a later run
    # evicted before it was handed over goes too, as it was
    batch = window.due(0.0, everything=True)
    assert batch is not None
    rows = [dict(zip(STEP_COLUMNS, (to_python(v) for v in row), strict=True)) for row in batch.cols.tolist()]
    keys = [(r["run"], r["step"]) for r in rows]
    assert keys == sorted(keys) and set(held) <= set(keys)
    for r in rows:
        rec = held.get((r["run"], r["step"]))
        if rec is not None:
            assert (r["ts"], r["running"], r["waiting"], r["kv_cache_usage"], r["generation_tokens"]) == (
                rec.ts,
                rec.running,
                rec.waiting,
                rec.kv_cache_usage,
                rec.generation_tokens,
            )
    assert window.due(0.0, everything=True) is None  # nothing twice
