"""The open-loop load of the GPU cost phase (scripts/gpu/open_loop.py): the Poisson schedule,
prompts that share no cache block, a segment's figures, and the client against a streaming
server on loopback that answers like vLLM's completions endpoint."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import open_loop as ol  # noqa: E402
from gpu_tier_lib import Result  # noqa: E402


def test_poisson_schedule_is_reproducible_and_indexed_from_first() -> None:
    a = ol.poisson_schedule(50.0, 10.0, seed=11, first_index=1000)
    assert a == ol.poisson_schedule(50.0, 10.0, seed=11, first_index=1000)
    assert a != ol.poisson_schedule(50.0, 10.0, seed=12, first_index=1000)
    assert [i for i, _ in a] == list(range(1000, 1000 + len(a)))
    times = [t for _, t in a]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 10.0


def test_poisson_schedule_has_the_rate_and_exponential_gaps() -> None:
    counts = [len(ol.poisson_schedule(40.0, 5.0, seed=s)) for s in range(300)]
    # 200 expected per draw, sd sqrt(200) ~ 14: the mean of 300 draws within 4 standard errors
    assert abs(statistics.fmean(counts) - 200) < 4 * math.sqrt(200 / 300)
    assert statistics.pstdev(counts) == pytest.approx(math.sqrt(200), rel=0.15)
    sched = ol.poisson_schedule(100.0, 200.0, seed=5)
    gaps = [b[1] - a[1] for a, b in zip(sched, sched[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.01, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


def test_poisson_schedule_refuses_a_rate_of_zero() -> None:
    with pytest.raises(ValueError):
        ol.poisson_schedule(0.0, 1.0, seed=1)


def test_unique_prompts_share_no_first_block_and_stay_in_vocabulary() -> None:
    firsts = {tuple(ol.unique_prompt(i, 512)[:16]) for i in list(range(70_000)) + [10**6, 10**8]}
    assert len(firsts) == 70_002
    p = ol.unique_prompt(123_456, 512)
    assert len(p) == 512 and min(p) >= 100 and max(p) < 31_100
    assert ol.unique_prompt(5, 1) == [105]


def test_split_and_client_procs() -> None:
    shares = ol.split(list(range(10)), 3)
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert ol.client_procs(100) == 1 and ol.client_procs(5000) == 3 and ol.client_procs(1e6) == 8


def _req(i: int, planned: float, first: float, gap: float, n: int, ok: bool = True) -> Result:
    chunks = [first + k * gap for k in range(n)]
    return Result(index=i, ok=ok, tokens=n, chunks=chunks, start=planned + 0.001, end=chunks[-1] + 0.001, scheduled=planned)


def test_summarise_counts_the_steady_window_only() -> None:
    t0 = 1000.0
    # one request before the window, two inside (TTFT 50 and 150 ms), one planned after it
    rs = [
        _req(0, t0 + 0.2, t0 + 0.3, 0.01, 100),  # chunks 0.3-1.29: 29 in [1, 2)... partly
        _req(1, t0 + 1.0, t0 + 1.05, 0.01, 50),  # chunks 1.05-1.54, all in the window
        _req(2, t0 + 1.5, t0 + 1.65, 0.02, 10),  # chunks 1.65-1.83
        _req(3, t0 + 2.5, t0 + 2.6, 0.01, 10),
    ]
    s = ol.summarise(rs, t0, warm_s=1.0, seconds=2.0)
    in_window = sum(1 for r in rs for c in r.chunks if t0 + 1 <= c < t0 + 2)
    assert s["tok_s"] == pytest.approx(in_window / 1.0)
    assert s["planned_in_window"] == 2 and s["offered_req_s"] == 2.0
    assert s["ttft_n"] == 2 and s["ttft_max_ms"] == pytest.approx(150.0)
    assert s["itl_p50_ms"] == pytest.approx(10.0) and s["itl_max_ms"] == pytest.approx(20.0)
    assert s["lag_max_ms"] == pytest.approx(1.0)
    assert s["tokens_per_chunk"] == 1.0
    assert s["per_request"]["ttft_ms"] == [pytest.approx(50.0), pytest.approx(150.0)]
    assert s["in_flight"]["start"] == 2  # request 0 (until 1.29) and request 1 (planned at 1.0)


def test_summarise_reports_failures_and_no_figures_as_null() -> None:
    bad = Result(index=0, ok=False, error="RuntimeError('HTTP/1.0 500')", start=1.0, end=1.1, scheduled=1.0)
    s = ol.summarise([bad], 0.0, warm_s=0.5, seconds=2.0)
    assert s["errors"] == 1 and s["completed"] == 0
    assert s["ttft_p99_ms"] is None and s["itl_p99_ms"] is None and s["tok_s"] == 0.0
    assert "500" in s["error_kinds"][0]


# ---- the client against a server that streams like vLLM ----------------------------------------


class FakeVllm:
    """``POST /v1/completions`` streaming ``max_tokens`` chunks ``gap_s`` apart after ``ttft_s``,
    then the usage chunk and [DONE]; keeps each request's id, prompt and arrival time."""

    def __init__(self, ttft_s: float = 0.02, gap_s: float = 0.005) -> None:
        self.ttft_s, self.gap_s = ttft_s, gap_s
        self.merge = 1  # tokens a chunk: vLLM's API server merges a request's tokens when behind
        self.seen: list[tuple[float, str, list[int]]] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(5)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            rid = next(h.split(b":")[1].strip().decode() for h in head.split(b"\r\n") if h.lower().startswith(b"x-request-id"))
            body = json.loads(await reader.readexactly(length))
            self.seen.append((time.time(), rid, body["prompt"]))
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            await asyncio.sleep(self.ttft_s)
            continuous = (body.get("stream_options") or {}).get("continuous_usage_stats")
            sent = 0
            while sent < body["max_tokens"]:
                if sent:
                    await asyncio.sleep(self.gap_s)
                sent = min(body["max_tokens"], sent + self.merge)
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": sent} if continuous else None
                writer.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": ""}], "usage": usage}).encode() + b"\n\n")
                await writer.drain()
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
            writer.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
            await writer.drain()
            writer.close()

        server = self.loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    f = FakeVllm()
    yield f
    f.loop.call_soon_threadsafe(f.loop.stop)


def test_open_loop_sends_on_schedule_and_times_from_the_plan(fake: FakeVllm) -> None:
    arrivals = ol.poisson_schedule(40.0, 1.0, seed=3, first_index=500)
    results, t0 = ol.run_open(f"http://127.0.0.1:{fake.port}", "m", arrivals, isl=32, osl=8, tag="t-", procs=2, lead_s=1.0)
    assert len(results) == len(arrivals) == len(fake.seen)
    by_index = {r.index: r for r in results}
    for idx, at in arrivals:
        r = by_index[idx]
        assert r.ok and r.tokens == 8 and len(r.chunks) == 8
        assert r.scheduled == pytest.approx(t0 + at)
        # never early; late by far less than the 1 s schedule (a loaded test machine allowed for)
        assert 0 <= r.start - (r.scheduled or 0) < 0.4
        assert r.chunks[0] - (r.scheduled or 0) >= fake.ttft_s
    # the server saw every request once, with its own prompt and id
    assert sorted(rid for _, rid, _ in fake.seen) == sorted(f"t-{i:04d}" for i, _ in arrivals)
    assert all(p == ol.unique_prompt(int(rid[2:]), 32) for _, rid, p in fake.seen)
    s = ol.summarise(results, t0, warm_s=0.0, seconds=1.0)
    assert s["errors"] == 0 and s["tokens_per_chunk"] == 1.0
    assert s["ttft_p50_ms"] >= 1000 * fake.ttft_s
    assert s["itl_p50_ms"] == pytest.approx(1000 * fake.gap_s, abs=4.0)


def test_open_loop_cuts_requests_at_the_drain_limit(fake: FakeVllm) -> None:
    fake.gap_s = 0.2  # 20 tokens: 4 s, more than the drain limit
    results, _ = ol.run_open(f"http://127.0.0.1:{fake.port}", "m", [(0, 0.0), (1, 0.05)], isl=8, osl=20, tag="d-", procs=1, drain_s=0.5)
    assert len(results) == 2
    assert all(not r.ok and "unfinished" in str(r.error) and 0 < len(r.chunks) < 20 for r in results)


def test_staggered_closed_loop_keeps_its_lanes_busy_and_spread(fake: FakeVllm) -> None:
    results, t0 = ol.run_closed_staggered(f"http://127.0.0.1:{fake.port}", "m", 4, 0, 16, 5, 1.0, 0.2, "c-", procs=2, lead_s=1.0)
    firsts = [min(r.start for r in results if r.index % 4 == k) - t0 for k in range(4)]
    assert all(f >= 0.05 * k - 0.002 for k, f in enumerate(firsts))  # no lane before its turn
    assert firsts[3] - firsts[0] >= 0.1  # spread over the stagger, not all at once
    assert len({r.index for r in results}) == len(results) >= 4 * 3  # each lane sent its next, and again
    assert all(r.ok for r in results if r.end < t0 + 1.0)


def test_tokens_are_counted_when_the_server_merges_them_into_chunks(fake: FakeVllm) -> None:
    fake.merge = 3  # 10 tokens in chunks of 3, 3, 3, 1
    results, t0 = ol.run_open(f"http://127.0.0.1:{fake.port}", "m", [(0, 0.0), (1, 0.01)], isl=8, osl=10, tag="m-", procs=1, lead_s=0.5)
    assert all(r.ok and r.tokens == 10 and len(r.chunks) == 4 and r.chunk_tokens == [3, 6, 9, 10] for r in results)
    assert ol.chunk_sizes(results[0]) == [3, 3, 3, 1]
    s = ol.summarise(results, t0, warm_s=0.0, seconds=5.0)
    assert s["tokens_per_chunk"] == 2.5 and s["usage_matches_chunks"] and s["requests_with_token_counts"] == 2
    assert s["tok_s"] == pytest.approx(20 / 5.0) and s["chunks_s"] == pytest.approx(8 / 5.0)
    # time per output token: first to last chunk over the 9 gaps between its 10 tokens
    tpot = sorted(1000 * (r.chunks[-1] - r.chunks[0]) / 9 for r in results)
    assert s["tpot_p50_ms"] == pytest.approx(tpot[0], abs=1e-3) or s["tpot_p50_ms"] == pytest.approx(tpot[1], abs=1e-3)


def test_chunk_sizes_fall_back_to_one_a_chunk_without_counts() -> None:
    r = Result(index=0, ok=True, tokens=3, chunks=[1.0, 2.0, 3.0], chunk_tokens=[1, 3])
    assert ol.chunk_sizes(r) == [1, 1, 1]
