"""vLLM's 10 s stat line -> numbers, over real lines and every optional field of 0.32."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.parsers.throughput_line import (
    ThroughputLineError,
    is_throughput_line,
    parse_throughput_line,
)
from collector.parsers.vllm_log import parse_line

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"


def _stat_lines(name: str) -> list[str]:
    text = (FIXTURES / name).read_text(encoding="utf-8", errors="replace")
    return [parse_line(r).message for r in text.splitlines() if "Avg prompt throughput" in r]


def _expected(message: str) -> dict[str, float]:
    """Independent reading of the line: split on ', ' and 'name: value unit'."""
    body = message.split(": ", 1)[1]
    out: dict[str, float] = {}
    for part in body.split(", "):
        name, _, value = part.rpartition(": ")
        number = float(value.split()[0].rstrip("%"))
        out[name] = number / 100 if value.endswith("%") else number
    return out


@pytest.mark.parametrize("name", ["normal.log", "crash.log", "sigkill.log", "crash-tp2.log"])
def test_real_stat_lines(name):
    lines = _stat_lines(name)
    assert lines, f"no stat line in {name}"
    for message in lines:
        got = parse_throughput_line(message)
        want = _expected(message)
        assert got["prompt_throughput"] == want["Avg prompt throughput"]
        assert got["generation_throughput"] == want["Avg generation throughput"]
        assert got["num_requests_running"] == want["Running"]
        assert got["num_requests_waiting"] == want["Waiting"]
        assert got["kv_cache_usage_perc"] == pytest.approx(want["CPU KV cache usage"])
        if "Prefix cache hit rate" in want:
            assert got["prefix_cache_hit_rate"] == pytest.approx(want["Prefix cache hit rate"])
        if "Preemptions" in want:
            assert got["num_preemptions"] == want["Preemptions"]
        assert got["kv_cache_device"] == "CPU"
        assert got["engine_index"] == 0.0


def test_every_optional_field_of_0_32():
    # Built from the format strings of vllm/v1/metrics/loggers.py (0.32), all parts enabled.
    message = (
        "Engine 001: Avg prompt throughput: 1200.5 tokens/s, Avg generation throughput: 88.0 "
        "tokens/s, Running: 16 reqs, Waiting: 7 reqs, Deferred: 2 reqs, KV fetch: 1 waiting "
        "to start, 3 in progress, 0 completed waiting, Preemptions: 4, GPU KV cache usage: "
        "96.8%, Prefix cache hit rate: 61.4%, Corrupted: 0 reqs, External prefix cache hit "
        "rate: 12.5%, MM cache hit rate: 50.0%"
    )
    got = parse_throughput_line(message)
    assert got == {
        "engine_index": 1.0,
        "prompt_throughput": 1200.5,
        "generation_throughput": 88.0,
        "num_requests_running": 16.0,
        "num_requests_waiting": 7.0,
        "num_requests_deferred": 2.0,
        "kv_fetch_waiting_to_start": 1.0,
        "kv_fetch_in_progress": 3.0,
        "kv_fetch_completed_waiting": 0.0,
        "num_preemptions": 4.0,
        "kv_cache_usage_perc": pytest.approx(0.968),
        "prefix_cache_hit_rate": pytest.approx(0.614),
        "num_corrupted_requests": 0.0,
        "external_prefix_cache_hit_rate": pytest.approx(0.125),
        "mm_cache_hit_rate": pytest.approx(0.5),
        "kv_cache_device": "GPU",
    }


def test_other_lines_are_refused():
    assert not is_throughput_line("Engine core process EngineCore died unexpectedly.")
    with pytest.raises(ThroughputLineError):
        parse_throughput_line("SpecDecoding metrics: Mean acceptance length: 2.10")


@given(st.text())
def test_any_text_raises_only_its_own_error(text):
    for candidate in (text, "Engine 000: Avg prompt throughput: " + text):
        try:
            out = parse_throughput_line(candidate)
        except ThroughputLineError:
            continue
        assert "prompt_throughput" in out
