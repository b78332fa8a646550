"""DetectorRunner: transitions only, hysteresis per (detector, labels), steps and scrapes merged."""

from __future__ import annotations

import dataclasses
import random

from detector_synth import gpu, noisy, scrapes, steps

from collector.detectors.config import DetectorThresholds
from collector.detectors.runner import DetectorRunner
from collector.model import HALF_REQUESTS, HALF_STATS, MetricsScrape, Severity, StepRecord

T0 = 1_000_000.0


def replay(runner: DetectorRunner, records, *, until: float, gpu_samples=(), scrape_list=(), every: float = 1.0):
    """Evaluate once per `every` seconds over what had arrived by then, as the hub does."""
    out = []
    t = T0 + every
    while t <= until:
        seen = [r for r in records if r.ts <= t]
        seen_gpu = [g for g in gpu_samples if g.ts <= t]
        seen_scrapes = [s for s in scrape_list if s.ts <= t]
        for tr in runner.evaluate({"decode-0": seen} if seen else {}, seen_gpu, seen_scrapes, now=t):
            out.append((t - T0, tr.current.name, tr.previous.state, tr.current.state))
        t += every
    return out


def stats_half(records: list[StepRecord]) -> list[StepRecord]:
    """The synthetic steps as the stat logger's half carries them: every figure known."""
    return [dataclasses.replace(r, prompt_tokens=0, finished=0, halves=HALF_STATS) for r in records]


def test_a_stall_fires_once_and_resolves_once() -> None:
    # 30 s of work, then the queue waits with no tokens for 40 s, then work again
    records = stats_half(steps(T0, 110, per_s=5, waiting=lambda t: 4, tokens=lambda t: 0 if 30 <= t < 70 else 8))
    runner = DetectorRunner(DetectorThresholds(enter_after=2, exit_after=3))
    out = [e for e in replay(runner, records, until=T0 + 110) if e[1] == "engine_stall"]
    assert [(prev, cur) for _, _, prev, cur in out] == [
        (Severity.OK, Severity.WARNING),
        (Severity.WARNING, Severity.CRITICAL),
        (Severity.CRITICAL, Severity.OK),
    ]
    fired_at = out[0][0]
    assert 40 <= fired_at <= 43  # 10 s without tokens + 2 evaluations of hysteresis


def test_noisy_healthy_engine_raises_nothing() -> None:
    rng = random.Random(11)
    records = stats_half(
        steps(
            T0,
            240,
            per_s=10,
            running=lambda t: int(noisy(rng, 12, 4)),
            waiting=lambda t: int(noisy(rng, 2, 2)),
            kv=lambda t: noisy(rng, 0.5, 0.1),
            tokens=lambda t: int(noisy(rng, 12, 6)),
            preemptions=lambda t: 1 if rng.random() < 0.01 else 0,
        )
    )
    runner = DetectorRunner()
    assert replay(runner, records, until=T0 + 240) == []


def test_scrapes_alone_drive_the_engine_detectors_and_scrape_gone() -> None:
    def values(t: float) -> dict[str, float]:
        return {
            "num_requests_running": 8,
            "num_requests_waiting": 3,
            "kv_cache_usage_perc": 0.4,
            "num_preemptions_total": 2.0 * t,
            "generation_tokens_total": 100.0 * t,
        }

    scrape_list = scrapes(T0, 40, values=values)  # scrapes stop at 40 s
    runner = DetectorRunner()
    out = replay(runner, [], scrape_list=scrape_list, until=T0 + 60)
    kinds = [(name, cur) for _, name, _, cur in out]
    assert ("preemption_storm", Severity.WARNING) in kinds  # 2/s >= 1/s
    gone = [t for t, name, _, cur in out if name == "scrape_target_gone" and cur is Severity.CRITICAL]
    assert gone and 44 <= gone[0] <= 47


def test_steps_with_unknown_figures_are_not_read_as_zeros() -> None:
    # Only the scheduler's half arrives (running known, the stat figures unknown) while the
    # scrapes show a preemption storm: the detectors read the scrapes (steps read as zeros
    # would hide the storm), and the steps' unknown tokens are no stall either.
    def values(t: float) -> dict[str, float]:
        return {
            "num_requests_running": 8,
            "num_requests_waiting": 3,
            "kv_cache_usage_perc": 0.4,
            "num_preemptions_total": 2.0 * t,
            "generation_tokens_total": 100.0 * t,
        }

    records = [StepRecord(engine="decode-0", ts=T0 + i / 5, step=i, running=8, halves=HALF_REQUESTS) for i in range(60 * 5)]
    out = replay(DetectorRunner(), records, scrape_list=scrapes(T0, 60, values=values), until=T0 + 60)
    kinds = [(name, cur) for _, name, _, cur in out]
    assert ("preemption_storm", Severity.WARNING) in kinds
    assert not [k for k in kinds if k[0] == "engine_stall"]


def test_gpu_detectors_are_per_gpu() -> None:
    samples = [gpu(T0 + t, temperature=95.0 if t >= 10 else 60.0, clock_event_reasons=0) for t in range(30)]
    runner = DetectorRunner()
    out = replay(runner, [], gpu_samples=samples, until=T0 + 30)
    assert [(name, cur) for _, name, _, cur in out] == [("gpu_throttling", Severity.CRITICAL)]
    state = next(s for s in runner.states() if s.name == "gpu_throttling")
    assert state.labels == {"gpu": "0000:00:06.0"} and "95C" in state.reason


def test_disabled_detectors_do_not_run() -> None:
    thr = DetectorThresholds()
    thr.preemption.enabled = False
    thr.scrape_gone.enabled = False
    scrape = [MetricsScrape("e", T0 + t, {"num_preemptions_total": 100.0 * t}) for t in range(20)]
    runner = DetectorRunner(thr)
    for t in range(1, 40):
        runner.evaluate({}, [], [s for s in scrape if s.ts <= T0 + t], now=T0 + t)
    assert {s.name for s in runner.states()}.isdisjoint({"preemption_storm", "scrape_target_gone"})


def test_scrape_series_kept_one_scrape_at_a_time_equal_the_series_read_afresh() -> None:
    from collector.detectors import series as S

    rng = random.Random(3)
    held: list[MetricsScrape] = []
    kept = S.ScrapeSeries()
    gen = prompt = preempt = 0.0
    for i in range(200):
        gen += rng.randint(0, 50)
        prompt += rng.randint(0, 20)
        preempt += rng.randint(0, 1)
        values = {"num_requests_running": float(rng.randint(0, 9)), "kv_cache_usage_perc": rng.random()}
        if i % 7:  # some scrapes without the waiting gauge: no demand point there
            values["num_requests_waiting"] = float(rng.randint(0, 9))
        if i != 50:  # one scrape without counters
            values |= {"generation_tokens_total": gen, "prompt_tokens_total": prompt, "num_preemptions_total": preempt}
        if i == 120:  # an engine restart: the counters begin again
            gen = prompt = 0.0
        held.append(MetricsScrape(engine="e", ts=T0 + i, values=values))
        kept.feed(list(held[-150:]))  # as the hub's deque, bounded
        window = held[-150:]
        start = window[0].ts
        kept.trim(start)
        assert list(kept.waiting) == S.gauge(window, S.WAITING)
        assert list(kept.running) == S.gauge(window, S.RUNNING)
        both = [(s.ts, S.scrape_value(s, S.RUNNING), S.scrape_value(s, S.WAITING)) for s in window]
        assert list(kept.demand) == [(ts, r + w) for ts, r, w in both if r is not None and w is not None]
        assert list(kept.kv) == S.gauge(window, S.KV_USAGE)
        assert list(kept.preempt) == S.counter(window, S.PREEMPTIONS)
        afresh = S.token_amounts(window)
        # read afresh, a window's first scrape has no amount; kept, it has the one since the scrape before
        assert list(kept.tokens)[-len(afresh) :] == afresh if afresh else True
        assert len(kept.tokens) - len(afresh) in (0, 1)
    # a list that does not hold the last scrape taken is read afresh
    other = [MetricsScrape(engine="e", ts=T0 + 5, values={"num_requests_waiting": 1.0})]
    kept.feed(other)
    assert list(kept.waiting) == [(T0 + 5, 1.0)] and list(kept.times) == [T0 + 5]


def test_every_detector_with_thresholds_is_in_the_table() -> None:
    from collector.detectors.config import DetectorThresholds
    from collector.detectors.runner import ENGINE_DETECTORS, GPU_DETECTORS

    configured = {name for name, value in DetectorThresholds() if hasattr(value, "enabled")}
    listed = [name for name, _ in ENGINE_DETECTORS + GPU_DETECTORS]
    # the wedge is judged by a watch of its own (detectors/wedge_watch.py): it emits events, not states
    assert sorted(listed) == sorted(configured - {"wedge"})  # each once, none without its thresholds


def test_the_gpus_ecc_window_reaches_back_further_than_the_engine_series() -> None:
    """The engine detectors read their own history (the longest engine window and baseline);
    the GPU's ECC window, longer, reads GPU samples only: an ECC increase 8 minutes ago is still
    raised, and the engine's scrape series hold no point older than the engine history."""
    runner = DetectorRunner()
    assert runner.engine_history_s() < DetectorThresholds().ecc.window_s < runner.history_s()
    now = T0 + 900.0
    samples = [gpu(T0 + t, ecc_volatile_uncorrected=0 if t < 400 else 1) for t in range(0, 901, 5)]
    scraped = [
        MetricsScrape(engine="decode-0", ts=T0 + t, values={"num_requests_running": 1.0, "num_requests_waiting": 0.0}) for t in range(0, 901, 5)
    ]
    for tick in range(5):  # past the hysteresis
        runner.evaluate({}, samples, scraped, now=now + tick)
    ecc = next(s for s in runner.states() if s.name == "gpu_memory_errors")
    assert ecc.state is Severity.CRITICAL  # the increase at 400 s, ~500 s before now
    series = runner._scrape_series["decode-0"]
    assert series.times[0] >= now - runner.engine_history_s()
    assert len(series.times) < len(scraped) / 2
