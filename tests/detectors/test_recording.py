"""Detectors replayed over a recording of a real vLLM run (tests/fixtures/recordings/README.md).

The run: a CPU vLLM 0.32 server with a 4,096-token KV cache under a ramp of 2/4/8/16/32
requests, /metrics polled every 0.2 s, then the server killed. It preempts, fills its KV cache,
slows down under contention, misses one poll, and finally disappears.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.detectors.config import DetectorThresholds
from collector.detectors.runner import DetectorRunner
from collector.model import MetricsScrape, Severity

RECORDING = Path(__file__).parent.parent / "fixtures" / "recordings" / "vllm-cpu-ramp.jsonl"


def load() -> tuple[list[MetricsScrape], list[float], float]:
    rows = [json.loads(line) for line in RECORDING.read_text().splitlines()]
    scrapes = [MetricsScrape("cpu-0", r["ts"], r["values"]) for r in rows if r["up"]]
    failed = [r["ts"] for r in rows if not r["up"]]
    return scrapes, failed, rows[-1]["ts"]


@pytest.fixture(scope="module")
def replay() -> dict:
    scrapes, failed, end = load()
    runner = DetectorRunner()
    t = scrapes[0].ts
    transitions = []
    i = 0
    while t <= end + 8:  # keep evaluating after the recording ends: the target stays gone
        while i < len(scrapes) and scrapes[i].ts <= t:
            i += 1
        for tr in runner.evaluate({}, [], scrapes[:i], now=t):
            transitions.append((t, tr.current.name, tr.previous.state, tr.current.state, tr.current.reason))
        t += 1.0
    return {"transitions": transitions, "scrapes": scrapes, "failed": failed}


def fired(replay: dict, name: str) -> list[tuple]:
    return [tr for tr in replay["transitions"] if tr[1] == name and tr[3] is not Severity.OK]


def test_the_recording_has_what_the_assertions_rely_on(replay: dict) -> None:
    scrapes = replay["scrapes"]
    assert max(s.values["num_preemptions_total"] for s in scrapes) >= 20
    assert max(s.values["kv_cache_usage_perc"] for s in scrapes) == 1.0
    assert replay["failed"][-1] > scrapes[-1].ts  # it ends with the target gone


def test_preemption_storm_is_seen(replay: dict) -> None:
    storms = fired(replay, "preemption_storm")
    assert storms, replay["transitions"]
    assert all("preemptions" in tr[4] for tr in storms)


def test_kv_jump_is_seen(replay: dict) -> None:
    assert fired(replay, "kv_cache_jump")


def test_the_target_gone_pages_only_after_the_kill(replay: dict) -> None:
    gone = fired(replay, "scrape_target_gone")
    last_scrape = replay["scrapes"][-1].ts
    assert len(gone) == 1  # the single missed poll during the run does not page
    assert gone[0][3] is Severity.CRITICAL
    assert last_scrape + 5 <= gone[0][0] <= last_scrape + 8


def test_no_stall_while_tokens_flow(replay: dict) -> None:
    assert not fired(replay, "engine_stall")


def test_each_kv_jump_is_a_ramp_phase_and_a_throughput_collapse_is_seen(replay: dict) -> None:
    # five phases (2, 4, 8, 16, 32 requests), each starting from a drained cache
    assert 1 <= len(fired(replay, "kv_cache_jump")) <= 5
    # on two shared cores the 32-request phase ran at a few percent of the earlier tokens/s
    assert fired(replay, "throughput_collapse")


def test_nothing_flaps(replay: dict) -> None:
    """Every published state holds for at least enter_after evaluations (one a second here).

    A detector may rightly re-enter soon after leaving: the 16-request phase filled the cache
    again 3 s after the 8-request phase drained it. What must not happen is a one-evaluation blip.
    """
    since: dict[str, float] = {}
    for ts, name, _, _, _ in replay["transitions"]:
        if name in since:
            assert ts - since[name] >= DetectorThresholds().enter_after, name
        since[name] = ts


def test_a_published_reason_matches_its_level(replay: dict) -> None:
    for _, name, _, current, reason in replay["transitions"]:
        if current is not Severity.OK:
            assert "baseline" not in reason or "%" in reason
            assert not reason.startswith(("rise ", "no request", "no throttling", "0 preemptions")), (name, reason)
