"""DetectorTask over a real hub: the detectors read each engine's steps folded per second, and
judge a load as they judge its steps one by one."""

from __future__ import annotations

import dataclasses

from detector_synth import steps

from collector.detectors.config import DetectorThresholds
from collector.detectors.runner import DetectorRunner
from collector.detectors.task import DetectorTask
from collector.ingest.hub import hub_for
from collector.model import HALF_STATS, StepRecord
from collector.settings import EngineConfig, Settings

T0 = 1_796_000_000.0


def _scenario() -> list[StepRecord]:
    # 100 steps/s: 40 s of work, a preemption storm and a KV jump from 40 s, a stall from 60 s
    records = steps(
        T0,
        100,
        per_s=100,
        waiting=lambda t: 3,
        tokens=lambda t: 0 if t >= 60 else 8,
        preemptions=lambda t: 1 if 40 <= t < 55 and int(t * 100) % 10 == 0 else 0,
        kv=lambda t: 0.9 if 40 <= t < 50 else 0.2,
    )
    return [dataclasses.replace(r, prompt_tokens=0, finished=0, halves=HALF_STATS) for r in records]


def _published(states: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {s.name: s.state.value for s in states if s.labels.get("engine") == "decode-0"}


def test_per_second_aggregates_give_the_detectors_verdicts_on_the_steps_themselves() -> None:
    now = [T0]
    thresholds = DetectorThresholds(enter_after=2, exit_after=3)
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://d")])
    hub = hub_for(settings, clock=lambda: now[0])
    task = DetectorTask(hub.view, hub.emit, thresholds)
    raw = DetectorRunner(thresholds, clock=lambda: now[0])
    records = _scenario()
    fed = 0
    held: list[StepRecord] = []
    by_task: list[tuple[int, str, str]] = []
    by_steps: list[tuple[int, str, str]] = []
    for second in range(1, 101):
        now[0] = T0 + second
        while fed < len(records) and records[fed].ts <= now[0]:
            hub.emit(records[fed])
            held.append(records[fed])
            fed += 1
        by_task += [(second, t.current.name, t.current.state.value) for t in task.tick()]
        by_steps += [(second, t.current.name, t.current.state.value) for t in raw.evaluate({"decode-0": held}, now=now[0])]
    names = {name for _, name, _ in by_steps}
    assert {"preemption_storm", "kv_cache_jump", "engine_stall"} <= names, by_steps
    # the same transitions, each within a tick of the other
    assert [(n, s) for _, n, s in by_task] == [(n, s) for _, n, s in by_steps]
    assert all(abs(a[0] - b[0]) <= 1 for a, b in zip(by_task, by_steps, strict=True))
    assert _published(task.states()) == _published(raw.states())
