from __future__ import annotations

import pytest

from collector.ingest.window import StepWindow
from collector.model import (
    HALF_REQUESTS,
    HALF_STATS,
    StepRecord,
)
from tests.request_columns import Row, make_block


def step(n: int, **kw: object) -> StepRecord:
    return StepRecord(engine="d", ts=float(n), step=n, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 16, 4096])
def test_window_keeps_exactly_the_last_n_steps(size: int) -> None:
    window = StepWindow("d", size)
    for i in range(size * 3 + 7):
        window.add(step(i))
    kept = window.steps()
    assert len(kept) == size
    assert [s.step for s in kept] == list(range(size * 2 + 7, size * 3 + 7))
    assert window.evicted == size * 2 + 7


def test_window_rejects_a_zero_size() -> None:
    with pytest.raises(ValueError):
        StepWindow("d", 0)


def reqs_half(n: int, rows: list[Row]) -> StepRecord:
    block = make_block(n, float(n), rows)
    return step(n, running=block.running, request_block=block, halves=HALF_REQUESTS)


@pytest.mark.parametrize("stats_first", [True, False])
def test_two_halves_of_a_step_merge_whichever_comes_first(stats_first: bool) -> None:
    window = StepWindow("d", 8)
    stats = step(5, running=3, waiting=2, kv_cache_usage=0.25, halves=HALF_STATS)
    reqs = reqs_half(5, [Row("a", 10, 11), Row("b", 20, 21)])
    for rec in (stats, reqs) if stats_first else (reqs, stats):
        window.add(rec)
    (held,) = window.steps()
    assert (held.running, held.waiting, held.kv_cache_usage) == (3, 2, 0.25)  # the stats win
    assert held.request_block is not None and held.request_block.column("request_id") == ["a", "b"]
    assert held.request_count == 2
    assert held.halves == HALF_STATS | HALF_REQUESTS
    assert held.preemptions is None  # no half carried it: unknown, not 0
    assert window.request_bytes == held.request_block.nbytes


def test_a_step_with_only_its_requests_half_has_unknown_stats() -> None:
    window = StepWindow("d", 8)
    held = window.add(reqs_half(7, [Row("a", 10, 11, status="running"), Row("b", 5, 5, status="waiting")]))
    assert held.halves == HALF_REQUESTS
    assert held.running == 1  # counted from the block's rows
    assert (held.waiting, held.kv_cache_usage, held.preemptions, held.generation_tokens) == (None, None, None, None)


def test_a_step_with_only_its_stats_half_has_no_request_figures() -> None:
    window = StepWindow("d", 8)
    held = window.add(step(9, running=4, waiting=0, halves=HALF_STATS))
    assert held.request_block is None and held.request_count is None
    assert held.mirror_rows is None and held.host_blocks is None
    assert (held.running, held.waiting) == (4, 0)  # a known 0 stays 0


def test_a_new_run_reusing_step_numbers_replaces_the_old_step() -> None:
    window = StepWindow("d", 8)
    window.add(StepRecord(engine="d", ts=1.0, step=3, running=5, halves=HALF_STATS, run=100))
    held = window.add(StepRecord(engine="d", ts=2.0, step=3, waiting=1, halves=HALF_STATS, run=200))
    assert held.run == 200 and held.running is None and held.waiting == 1  # nothing merged across runs
    assert [(s.run, s.step) for s in window.steps()] == [(200, 3)]


def test_a_late_half_of_the_run_before_does_not_replace_the_new_runs_step() -> None:
    window = StepWindow("d", 8)
    window.add(StepRecord(engine="d", ts=1.0, step=3, running=5, halves=HALF_STATS, run=100))
    window.add(StepRecord(engine="d", ts=2.0, step=3, waiting=1, halves=HALF_STATS, run=200))
    late = window.add(StepRecord(engine="d", ts=1.1, step=3, running=6, halves=HALF_STATS, run=100))
    assert late.run == 100  # handed back as it came: not held
    assert [(s.run, s.step, s.waiting) for s in window.steps()] == [(200, 3, 1)]
    batch = window.due(0.0, everything=True)
    assert batch is not None
    assert sorted(zip(batch.cols["run"].tolist(), batch.cols["step"].tolist(), strict=True)) == [(100, 3), (100, 3), (200, 3)]  # all stored


def test_request_blocks_are_bounded_by_bytes_and_their_steps_kept() -> None:
    rows = [Row(f"r{i}", 10, 11) for i in range(16)]
    size = reqs_half(0, rows).request_block.nbytes  # type: ignore[union-attr]
    window = StepWindow("d", 64, max_request_bytes=size * 3)
    for n in range(10):
        window.add(reqs_half(n, rows))
    kept = window.steps()
    assert len(kept) == 10  # every step kept
    assert [s.step for s in kept if s.request_block is not None] == [7, 8, 9]  # the newest blocks
    assert window.blocks_evicted == 7 and window.request_bytes <= size * 3
    assert kept[0].running == 16  # the aggregate outlives the block


def test_steps_come_back_in_step_order() -> None:
    window = StepWindow("d", 8)
    for n in (3, 1, 2):
        window.add(step(n))
    assert [s.step for s in window.steps()] == [1, 2, 3]
    assert window.last() is not None and window.last().step == 3  # type: ignore[union-attr]


def test_steps_fold_into_one_record_per_second_for_the_detectors() -> None:
    window = StepWindow("d", 4096)
    block = make_block(3, 10.7, [Row("r1", 10, 10, 1), Row("r2", 10, 10, 1, status="preempted")])
    window.add(
        StepRecord(
            engine="d",
            ts=10.1,
            step=1,
            running=4,
            waiting=2,
            kv_cache_usage=0.2,
            preemptions=1,
            prompt_tokens=5,
            generation_tokens=4,
            finished=0,
            halves=HALF_STATS,
        )
    )
    window.add(
        StepRecord(engine="d", ts=10.5, step=2, running=5, waiting=None, kv_cache_usage=0.3, preemptions=2, generation_tokens=6, halves=HALF_STATS)
    )
    # a requests half alone: its block, not its running count over the stats'
    window.add(StepRecord(engine="d", ts=10.7, step=3, running=1, request_block=block, halves=HALF_REQUESTS))
    window.add(StepRecord(engine="d", ts=11.2, step=4, running=1, request_block=block, halves=HALF_REQUESTS))
    first, second = window.seconds.all()
    assert (first.ts, first.step, first.halves) == (10.7, 3, HALF_STATS | HALF_REQUESTS)
    assert (first.running, first.waiting, first.kv_cache_usage) == (5, 2, 0.3)  # the newest known
    assert (first.preemptions, first.prompt_tokens, first.generation_tokens, first.finished) == (3, 5, 10, 0)  # sums
    assert first.request_block is block and first.host_blocks is None
    # a second with no stats half: its figures are unknown, not 0
    assert second.halves == HALF_REQUESTS and second.running == 1
    assert second.waiting is None and second.generation_tokens is None and second.preemptions is None
    # the stats half of step 4 arrives late: it folds into its own second
    window.add(StepRecord(engine="d", ts=11.2, step=4, running=7, waiting=0, generation_tokens=3, halves=HALF_STATS))
    second = window.seconds.all()[1]
    assert second.halves == HALF_STATS | HALF_REQUESTS and (second.running, second.waiting, second.generation_tokens) == (7, 0, 3)
    # a late half of a past second that had no step is let go; an old second still held is not
    window.add(StepRecord(engine="d", ts=10.9, step=9, generation_tokens=100, halves=HALF_STATS))
    assert window.seconds.all()[0].generation_tokens == 110
    window.add(StepRecord(engine="d", ts=13.0, step=10, generation_tokens=1, halves=HALF_STATS))
    window.add(StepRecord(engine="d", ts=12.5, step=11, generation_tokens=1, halves=HALF_STATS))
    assert [int(s.ts) for s in window.seconds.all()] == [10, 11, 13]


def test_per_second_aggregates_keep_the_last_two_minutes() -> None:
    window = StepWindow("d", 64)
    for i in range(300 * 10):
        window.add(StepRecord(engine="d", ts=1000.0 + i / 10, step=i, generation_tokens=2, halves=HALF_STATS))
    held = window.seconds.all()
    assert len(held) == 120 and int(held[0].ts) == 1180 and int(held[-1].ts) == 1299
    assert all(s.generation_tokens == 20 for s in held)


def test_a_step_copy_holds_every_field_of_the_original_in_a_new_record() -> None:
    import dataclasses

    block = make_block(7, 1.5, [Row("r1", 10, 11)])
    rec = StepRecord(engine="d", ts=1.5, step=7, running=1, kv_cache_usage=None, connector={"x": 1}, request_block=block, halves=3, run=42)
    twin = rec.copy()
    assert twin is not rec
    assert all(getattr(twin, f.name) is getattr(rec, f.name) for f in dataclasses.fields(StepRecord))  # compare=False ones too
