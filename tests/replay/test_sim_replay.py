"""The simulated pair writes the incident's workload through the recorder channel, and serves
/v1/completions whose fault fires at the same load point: a replay of its own workload
reproduces the crash in the C16 phase."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from collector.channel import RingReader
from collector.channel.blocks import RequestRecords
from collector.channel.codec import decode
from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadBatch
from collector.replay.compare import compare
from collector.replay.driver import Driver
from collector.replay.plan import Plan, build_plan
from collector.sim.pair import PairConfig, SimPair

STEPS_PER_S = 3000.0  # twice the demo's: the same ramp in ~10 s


async def record(pair: SimPair, engine: str) -> WorkloadLog:
    """Run the pair to its crash, tailing the decode engine's rings as the sidecar does."""
    log = WorkloadLog()
    readers = [(RingReader(p), RequestRecords()) for p in sorted(pair.cfg.recorder_dir.glob(f"{engine}*.ring"))]

    def drain() -> None:
        for rd, requests in readers:
            for payload in rd.read():
                _, obs = decode(payload, engine=engine, requests=requests)
                if isinstance(obs, WorkloadBatch):
                    log.add(obs)

    run = asyncio.create_task(pair.run())
    while not run.done():
        drain()
        await asyncio.sleep(0.05)
    drain()
    await run
    for rd, _ in readers:
        rd.close()
    return log


def plan_of_demo(tmp_path: Path) -> Plan:
    async def go() -> Plan:
        pair = SimPair(PairConfig(workdir=tmp_path / "a", recorder_dir=tmp_path / "a/rec", steps_per_second=STEPS_PER_S))
        await pair.start()
        try:
            log = await record(pair, "decode-0")
        finally:
            await pair.close()
        assert pair.crashed_at is not None
        return build_plan(log.export(pair.crashed_at, crashed=True))

    return asyncio.run(go())


def test_the_demo_workload_is_the_incident_ramp_and_a_replay_dies_in_c16(tmp_path: Path) -> None:
    plan = plan_of_demo(tmp_path)
    # the ramp, as decode saw it: C16 holds the 16 first requests and the 9 that replaced the
    # first done ones and reached decode; the 6 never sent and the one in prefill are not there
    assert [(p.concurrency, len(p.requests)) for p in plan.phases] == [(1, 4), (2, 6), (4, 12), (8, 16), (16, 25)]
    assert {r.prompt_len for r in plan.requests} == {32000} and {r.max_tokens for r in plan.requests} == {2000}
    assert {r.output_len for r in plan.requests if r.outcome == "finished"} == {2000}
    crash = plan.crash_phase
    assert crash is not None and (crash.concurrency, crash.original("finished"), crash.original("failed_by_crash")) == (16, 10, 15)

    async def replay() -> tuple[object, SimPair, WorkloadLog]:
        pair = SimPair(PairConfig(workdir=tmp_path / "b", recorder_dir=tmp_path / "b/rec", steps_per_second=STEPS_PER_S, serve_completions=True))
        await pair.start()
        run = asyncio.create_task(record(pair, "decode-0"))
        try:
            async with httpx.AsyncClient(timeout=None) as client:
                driver = Driver(plan, target=f"http://127.0.0.1:{pair.decode.port}", model=pair.cfg.scenario.model, client=client, seed=1)
                result = await driver.run()
            log = await asyncio.wait_for(run, timeout=10)
        finally:
            run.cancel()
            await pair.close()
        return result, pair, log

    result, pair, log = asyncio.run(replay())
    assert result.died and pair.crashed_at is not None  # type: ignore[attr-defined]
    assert result.died_phase == 5 and result.done_before_death == 10  # type: ignore[attr-defined]
    phases = [(p.concurrency, p.done, p.failed) for p in result.phases]  # type: ignore[attr-defined]
    assert phases == [(1, 4, 0), (2, 6, 0), (4, 12, 0), (8, 16, 0), (16, 10, 15)]
    # the replay's own workload, as the pair's decode engine recorded it, has the same shape
    again = build_plan(log.export(pair.crashed_at, crashed=True))  # type: ignore[attr-defined]
    cmp = compare(plan, again)
    assert cmp.same_prompts and cmp.same_max_tokens and cmp.same_concurrency, cmp.notes
    assert cmp.same_fault_point is True, cmp.notes


def test_a_load_below_the_crash_level_never_kills_the_replay_target(tmp_path: Path) -> None:
    async def go() -> tuple[int, bool]:
        pair = SimPair(PairConfig(workdir=tmp_path, recorder_dir=tmp_path / "rec", steps_per_second=STEPS_PER_S, serve_completions=True))
        await pair.start()
        run = asyncio.create_task(pair.run())
        try:
            async with httpx.AsyncClient(timeout=None) as client:
                url = f"http://127.0.0.1:{pair.decode.port}/v1/completions"
                bodies = [{"model": "m", "prompt": list(range(10, 60)), "max_tokens": 20} for _ in range(8)]
                resps = await asyncio.gather(*(client.post(url, json=b) for b in bodies))
                bad = await client.post(url, json={"prompt": []})
            assert bad.status_code == 400
            assert all(r.json()["usage"]["completion_tokens"] == 20 for r in resps)
            return sum(r.status_code == 200 for r in resps), pair.crashed_at is None
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await pair.close()

    ok, alive = asyncio.run(go())
    assert ok == 8 and alive
