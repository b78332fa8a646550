from __future__ import annotations

import pytest

from collector.model import GpuSample, LogLine, RequestRow, StepRecord
from collector.ingest.rings import EngineRing, LineRing, TimeRing


def step(n: int, **kw: object) -> StepRecord:
    return StepRecord(engine="d", ts=float(n), step=n, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 16, 4096])
def test_ring_keeps_exactly_the_last_n_steps(size: int) -> None:
    ring = EngineRing(size)
    for i in range(size * 3 + 7):
        ring.add(step(i))
    kept = ring.steps()
    assert len(kept) == size
    assert [s.step for s in kept] == list(range(size * 2 + 7, size * 3 + 7))
    assert ring.evicted == size * 2 + 7


def test_ring_rejects_a_zero_size() -> None:
    with pytest.raises(ValueError):
        EngineRing(0)


@pytest.mark.parametrize("stats_first", [True, False])
def test_two_halves_of_a_step_merge_whichever_comes_first(stats_first: bool) -> None:
    ring = EngineRing(8)
    stats = step(5, running=3, waiting=2, kv_cache_usage=0.25)
    reqs = step(5, running=2, requests=[RequestRow("a", 10, 11), RequestRow("b", 20, 21)])
    for rec in (stats, reqs) if stats_first else (reqs, stats):
        ring.add(rec)
    (held,) = ring.steps()
    assert (held.running, held.waiting, held.kv_cache_usage) == (3, 2, 0.25)  # the stats win
    assert held.requests is not None and [r.request_id for r in held.requests] == ["a", "b"]


def test_steps_come_back_in_step_order() -> None:
    ring = EngineRing(8)
    for n in (3, 1, 2):
        ring.add(step(n))
    assert [s.step for s in ring.steps()] == [1, 2, 3]
    assert ring.last() is not None and ring.last().step == 3  # type: ignore[union-attr]


def test_time_ring_keeps_the_last_seconds() -> None:
    ring = TimeRing(10.0)
    for t in range(100):
        ring.add(GpuSample(gpu="g", index=0, ts=float(t)))
    assert len(ring) == 11 and ring.since(95.0)[0].ts == 95.0


def test_line_ring_is_bounded() -> None:
    ring = LineRing(3)
    ring.extend(LogLine("d", float(i), f"l{i}") for i in range(10))
    assert [x.line for x in ring.all()] == ["l7", "l8", "l9"]
