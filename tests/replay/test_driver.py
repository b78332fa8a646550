"""The replay driver against a fake OpenAI-compatible engine (httpx.MockTransport): the load's
shape, the death and where it happened, a stop, and the table."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
from replay_helpers import ramp_workload

from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd
from collector.replay.driver import Driver, target_model
from collector.replay.plan import build_plan
from collector.replay.report import LineProgress, TtyProgress, result_table, verdict_text


@dataclass
class FakeEngine:
    """Serves a completion after ``seconds``; dies (500s, then /health down) once ``die_at_level``
    requests are in flight and ``die_after_done`` have completed since that level was reached."""

    seconds: float
    die_at_level: int | None = None
    die_after_done: int = 0
    in_flight: int = 0
    peak: int = 0
    done_at_level: int = 0
    level_reached: bool = False
    dead: bool = False
    bodies: list[dict] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    peaks_by_len: dict[int, int] = field(default_factory=dict)
    health_lag: float = 0.0  # /health keeps answering 200 this long after the death
    dead_since: float | None = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            gone = self.dead and self.dead_since is not None and time.monotonic() - self.dead_since >= self.health_lag
            return httpx.Response(503 if gone else 200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content)
        self.bodies.append(body)
        self.sent_at.append(time.monotonic() - self.t0)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.die_at_level is not None and self.in_flight >= self.die_at_level:
            self.level_reached = True
        try:
            await asyncio.sleep(self.seconds)
            if self.dead:
                return httpx.Response(500, json={"error": "EngineDeadError"})
            if self.level_reached:
                self.done_at_level += 1
                if self.done_at_level > self.die_after_done:
                    self.dead, self.dead_since = True, self.dead_since or time.monotonic()
                    return httpx.Response(500, json={"error": "EngineDeadError"})
            return httpx.Response(200, json={"choices": [{"text": ""}], "usage": {"completion_tokens": body["max_tokens"]}})
        finally:
            self.in_flight -= 1


def run(driver: Driver) -> object:
    return asyncio.run(driver.run())


def driver_for(engine: FakeEngine, plan: object, **kw: object) -> Driver:
    client = httpx.AsyncClient(transport=httpx.MockTransport(engine.handle))
    return Driver(plan, target="http://engine", model="tiny", client=client, seed=3, **kw)  # type: ignore[arg-type]


def test_the_replay_sends_the_recorded_shape_and_holds_each_level() -> None:
    plan = build_plan(ramp_workload(((1, 2), (2, 4), (4, 8)), prompt_len=200, max_tokens=50))
    engine = FakeEngine(seconds=0.05)
    result = run(driver_for(engine, plan, speed=100.0))
    assert [(p.done, p.failed, p.not_sent) for p in result.phases] == [(2, 0, 0), (4, 0, 0), (8, 0, 0)]
    assert not result.died and not result.interrupted and result.output_tokens == 14 * 50
    assert engine.peak == 4
    assert {len(b["prompt"]) for b in engine.bodies} == {200}
    assert {(b["model"], b["max_tokens"], b["ignore_eos"]) for b in engine.bodies} == {("tiny", 50, True)}
    # the first requests of each level never before their recorded offset (scaled by speed); the
    # later ones of a closed-loop level go as a slot comes free
    assert all(p.closed_loop for p in plan.phases)
    sent = sorted(engine.sent_at)
    firsts = [sum(len(q.requests) for q in plan.phases[: p.number - 1]) + k for p in plan.phases for k in range(p.concurrency)]
    offsets = [r.offset / 100.0 for r in plan.requests]
    assert all(sent[i] >= offsets[i] - 0.01 for i in firsts)


def test_a_faster_target_holds_each_level_of_a_closed_loop_phase() -> None:
    """The original took 0.1 s a request (at this speed), the target 0.02 s: paced by the recorded
    offsets the C4 level would sit at 4 in flight a fifth of the time; paced by its slots it holds 4."""
    plan = build_plan(ramp_workload(((4, 24),), prompt_len=10, duration=10.0))
    assert plan.phases[0].closed_loop
    engine = FakeEngine(seconds=0.02)
    changes: list[tuple[float, int]] = []
    orig = engine.handle

    async def watch(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/completions":
            return await orig(request)
        changes.append((time.monotonic(), engine.in_flight + 1))
        try:
            return await orig(request)
        finally:
            changes.append((time.monotonic(), engine.in_flight))

    client = httpx.AsyncClient(transport=httpx.MockTransport(watch))
    result = asyncio.run(Driver(plan, target="http://engine", model="tiny", client=client, speed=100.0).run())
    assert result.done == 24 and engine.peak == 4
    at_level = sum(t1 - t0 for (t0, n), (t1, _) in zip(changes, changes[1:], strict=False) if n == 4)
    assert at_level / (changes[-1][0] - changes[0][0]) > 0.6, changes


def test_an_open_loop_phase_keeps_its_recorded_offsets() -> None:
    """Arrivals every 0.5 s of requests that take 0.1 s: no arrival answers an end, so the plan
    paces them by their offsets."""
    log = WorkloadLog()
    for i in range(6):
        a = 1000.0 + 0.5 * i
        log.add(WorkloadBatch("decode-0", a, [WorkloadArrival(f"r{i}", a, 10, 5, None, None, None)]))
        log.add(WorkloadBatch("decode-0", a + 0.1, [WorkloadEnd(f"r{i}", a + 0.1, 5, "length", None)]))
    plan = build_plan(log.export(1004.0, crashed=False))
    assert [p.closed_loop for p in plan.phases] == [False]


def test_a_slower_target_gets_the_same_levels_not_more() -> None:
    plan = build_plan(ramp_workload(((1, 2), (2, 4), (4, 8)), prompt_len=10, duration=1.0))
    engine = FakeEngine(seconds=0.2)  # the original took 0.01 s per request at this speed
    seen: list[int] = []
    orig = engine.handle

    async def watch(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            seen.append(engine.in_flight + 1)
        return await orig(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(watch))
    result = asyncio.run(Driver(plan, target="http://engine", model="tiny", client=client, speed=100.0).run())
    assert result.done == 14 and engine.peak == 4
    # each phase's requests met at most its level in flight: the C1 ones alone, the C2 ones in pairs
    assert seen[:2] == [1, 1] and max(seen[2:6]) == 2


def test_the_engine_dying_at_the_same_load_point_stops_the_replay_and_says_where() -> None:
    plan = build_plan(ramp_workload(((1, 2), (2, 4), (4, 12)), prompt_len=10, crash_in_last_after=5))
    engine = FakeEngine(seconds=0.05, die_at_level=4, die_after_done=5)
    result = run(driver_for(engine, plan, speed=100.0))
    assert result.died and result.died_phase == 3 and result.done_before_death == 5
    last = result.phases[-1]
    assert last.done == 5 and last.failed >= 1 and last.done + last.failed + last.not_sent == last.planned
    text = result_table(plan, result) + "\n" + verdict_text(plan, result, {"id": 9, "engine": "decode-0", "trigger_kind": "cuda_error"})
    assert "engine died again: yes, in phase 3 (C4) after 5 done there" in text
    assert "the original died in the same phase after 5 done there" in text
    assert "new snapshot: 9 (decode-0, trigger cuda_error)" in text
    assert any("500" in e for e in result.errors)


def test_a_death_whose_health_goes_a_moment_after_the_errors_is_still_a_death() -> None:
    """vLLM's API server answers EngineDeadError while it still serves /health: the failures come
    first, /health goes 0.4 s later. Asked once, right after the errors, /health said alive."""
    plan = build_plan(ramp_workload(((1, 2), (2, 4), (4, 12)), prompt_len=10, crash_in_last_after=5))
    engine = FakeEngine(seconds=0.05, die_at_level=4, die_after_done=5, health_lag=0.4)
    result = run(driver_for(engine, plan, speed=100.0))
    assert result.died and result.died_phase == 3 and result.done_before_death == 5


def test_a_stop_ends_cleanly_with_the_table_so_far() -> None:
    plan = build_plan(ramp_workload(((1, 3), (2, 4)), prompt_len=10))
    engine = FakeEngine(seconds=0.05)
    driver = driver_for(engine, plan, speed=10.0)  # 1 s per request

    async def go() -> object:
        task = asyncio.create_task(driver.run())
        await asyncio.sleep(1.5)
        driver.stop.set()
        return await task

    result = asyncio.run(go())
    assert result.interrupted and not result.died
    assert result.done >= 1 and sum(p.not_sent for p in result.phases) >= 1
    assert "replay interrupted" in verdict_text(plan, result, None)


def test_progress_lines_name_the_phase_and_counts() -> None:
    import io

    plan = build_plan(ramp_workload(((1, 1), (2, 2)), prompt_len=10))
    engine = FakeEngine(seconds=0.01)
    driver = driver_for(engine, plan, speed=1000.0)
    result = run(driver)
    out = io.StringIO()
    lines = LineProgress(out)
    lines.update(result, 2.0)
    assert out.getvalue() == "phase 2/2 C2  done 3  failed 0  in flight 0  elapsed 0:00:02  rate 1.50 req/s\n"
    lines.update(result, 3.0)  # same phase, within 10 s of the last line: silent
    assert out.getvalue().count("\n") == 1
    tty = io.StringIO()
    bar = TtyProgress(tty)
    bar.update(result, 2.0)
    bar.update(result, 3.0)
    bar.close()
    # one line rewritten in place, erased at the end for the table
    assert tty.getvalue().count("\r\x1b[K") == 3 and "\n" not in tty.getvalue() and "elapsed 0:00:03" in tty.getvalue()


def test_the_target_names_its_model() -> None:
    engine = FakeEngine(seconds=0.0)

    async def go() -> str | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handle)) as c:
            return await target_model(c, "http://engine")

    assert asyncio.run(go()) == "tiny"
