"""``StepPoints``: the steps' series kept from tick to tick equal the series read afresh."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.detectors.series import STEP_SERIES, StepPoints
from collector.model import HALF_REQUESTS, HALF_STATS, StepRecord


class Block:
    """What the series read of a request block: its host blocks."""

    def __init__(self, host_blocks: int | None) -> None:
        self.host_blocks = host_blocks
        self.mirror_rows = None


def reference(steps: list[StepRecord]) -> dict[str, list[tuple[float, float]]]:
    """Every series read off every step, the plain way."""
    stats = [s for s in steps if s.halves & HALF_STATS]

    def level(stat: str) -> list[tuple[float, float]]:
        out = []
        for s in steps:
            for key, value in s.connector.items():
                if key.split(".")[-1] == stat and isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.append((s.ts, float(value)))
                    break
        return out

    return {
        "waiting": [(s.ts, float(s.waiting)) for s in stats if s.waiting is not None],
        "tokens": [
            (s.ts, float((s.generation_tokens or 0) + (s.prompt_tokens or 0)))
            for s in stats
            if s.generation_tokens is not None or s.prompt_tokens is not None
        ],
        "kv": [(s.ts, s.kv_cache_usage) for s in stats if s.kv_cache_usage is not None],
        "preempt": [(s.ts, float(s.preemptions)) for s in stats if s.preemptions is not None],
        "demand": [(s.ts, float(s.running + s.waiting)) for s in stats if s.waiting is not None and s.running is not None],
        "blocks": [(s.ts, float(s.host_blocks)) for s in steps if s.host_blocks is not None],
        "running": [(s.ts, float(s.running)) for s in steps if s.running is not None],
        "pending": level("pending_page_transfers"),
        "usage": level("host_cache_usage_perc"),
    }


maybe = st.none() | st.integers(0, 50)
step_fields = st.fixed_dictionaries(
    {
        "running": maybe,
        "waiting": maybe,
        "kv_cache_usage": st.none() | st.floats(0, 1),
        "prompt_tokens": maybe,
        "generation_tokens": maybe,
        "preemptions": maybe,
        "halves": st.sampled_from([HALF_STATS, HALF_REQUESTS, HALF_STATS | HALF_REQUESTS]),
        "connector": st.sampled_from(
            [{}, {"HiSparse.pending_page_transfers": 3}, {"host_cache_usage_perc": 0.5, "x.pending_page_transfers": True}, {"a.b": 1}]
        ),
        "blocks": st.none() | st.integers(-1, 9),
    }
)


def make(ts: float, f: dict[str, object]) -> StepRecord:
    blocks = f["blocks"]
    fields = {k: v for k, v in f.items() if k != "blocks"}
    block = None if blocks is None else Block(None if blocks == -1 else int(blocks))  # type: ignore[call-overload]
    return StepRecord(engine="e", ts=ts, step=int(ts), request_block=block, **fields)  # type: ignore[arg-type]


# one tick: how many of the oldest steps leave the window, whether the newest (open) one is
# rebuilt, whether a past one is (a late half), and the new steps' fields
tick = st.tuples(st.integers(0, 4), st.booleans(), st.none() | st.integers(0, 30), st.lists(step_fields, max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(step_fields, max_size=12), st.lists(tick, min_size=1, max_size=12))
def test_series_kept_from_tick_to_tick_equal_the_series_read_afresh(first: list[dict[str, object]], ticks: list) -> None:
    ts = 0.0
    steps: list[StepRecord] = []
    for f in first:
        ts += 1.0
        steps.append(make(ts, f))
    points = StepPoints()
    for leave, reopen, late, new in ticks:
        steps = steps[leave:]
        if reopen and steps:  # the newest second's record, made again (it may have changed)
            steps[-1] = dataclasses.replace(steps[-1], running=(steps[-1].running or 0) + 1)
        if late is not None and steps:  # a late half rebuilt a past second's record
            i = late % len(steps)
            steps[i] = dataclasses.replace(steps[i], waiting=(steps[i].waiting or 0) + 1, halves=steps[i].halves | HALF_STATS)
        for f in new:
            ts += 1.0
            steps.append(make(ts, f))
        points.update(steps)
        want = reference(steps)
        assert dict(zip(STEP_SERIES, points.series, strict=True)) == want
        assert points.from_steps == any(s.halves & HALF_STATS for s in steps)


def test_a_tick_reads_only_the_steps_since_the_last_one() -> None:
    steps = [StepRecord(engine="e", ts=float(t), step=t, waiting=1, running=2, halves=HALF_STATS) for t in range(100)]
    points = StepPoints()
    points.update(steps)
    seen: list[StepRecord] = []

    class Counted(StepRecord):
        __slots__ = ()

        @property
        def host_blocks(self) -> int | None:
            seen.append(self)
            return None

    newest = [Counted(engine="e", ts=float(t), step=t, waiting=1, running=2, halves=HALF_STATS) for t in (99, 100, 101)]
    points.update(steps[3:99] + newest)
    assert len(seen) == 3 and all(a is b for a, b in zip(seen, newest, strict=True))  # the previous newest again, the two new ones
    assert points.series[0] == [(float(t), 1.0) for t in range(3, 102)]


def test_a_step_that_fails_to_read_leaves_the_next_tick_to_read_afresh() -> None:
    steps = [StepRecord(engine="e", ts=float(t), step=t, waiting=1, running=2, halves=HALF_STATS) for t in range(10)]
    points = StepPoints()
    points.update(steps)

    class Broken(StepRecord):
        __slots__ = ()

        @property
        def host_blocks(self) -> int | None:
            raise RuntimeError("unreadable")

    bad = Broken(engine="e", ts=10.0, step=10, waiting=1, running=2, halves=HALF_STATS)
    try:
        points.update([*steps, bad])
    except RuntimeError:
        pass
    later = [*steps[1:], StepRecord(engine="e", ts=11.0, step=11, waiting=3, running=2, halves=HALF_STATS)]
    points.update(later)
    assert dict(zip(STEP_SERIES, points.series, strict=True)) == reference(later)
    assert points.from_steps
