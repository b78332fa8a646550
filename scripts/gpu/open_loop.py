"""Open-loop load for a vLLM OpenAI server: Poisson arrivals at a fixed rate, fixed prompt and
output lengths (token-id prompts, ``ignore_eos``), each request streamed; and a closed loop whose
lanes start staggered, for the server's capacity. Per segment: output tokens/s, TTFT counted
from the planned arrival (a late client does not hide the server's queue), inter-token latency.

Why an open loop: a closed loop of c clients with one output length sends its c requests
together, they finish on the same step and come back together, so the server swings between a
burst of prefills and a tail of decodes; a window of a few seconds catches a varying number of
those swings (the same server moved 6-53% between 6 s loops). Poisson arrivals at a fixed rate
keep the batch's make-up steady; under capacity the tokens/s follow the offered load (a server
that keeps up delivers what was asked), so the figures that tell R from N there are the
latencies, and at capacity the closed loop's tokens/s.

Standard library only; every request is its own connection (HTTP/1.0, as gpu_tier_lib's client).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import random
import time
from collections.abc import Sequence
from typing import Any

from gpu_tier_lib import Result, _one, quantile

Arrival = tuple[int, float]  # (request index, seconds after the segment's start)


def poisson_schedule(rate: float, duration: float, seed: int, first_index: int = 0) -> list[Arrival]:
    """Arrivals of a Poisson process of ``rate`` per second over [0, ``duration``): exponential
    gaps from a generator seeded with ``seed``, so R and N of one round get the very same
    arrivals (the round's ratio then compares the servers, not two draws of the load)."""
    if rate <= 0 or duration <= 0:
        raise ValueError(f"rate and duration must be positive, got {rate}, {duration}")
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < duration:
        out.append((first_index + len(out), t))
        t += rng.expovariate(rate)
    return out


def unique_prompt(index: int, length: int) -> list[int]:
    """Token ids, different for every index below 900 million from the first token on: no two
    requests of a run share a prefix-cache block (vLLM's prefix cache is on by default), so
    every request's prefill is computed. Ids in [100, 31100): valid for any Llama vocabulary."""
    head = [100 + index % 30011, 100 + (index // 30011) % 30011]
    return (head + [(7 * k + 13 * index) % 31000 + 100 for k in range(max(0, length - 2))])[:length]


def split(items: Sequence[Any], procs: int) -> list[list[Any]]:
    """Round-robin shares for ``procs`` client processes (together they are the whole schedule)."""
    return [list(items[k::procs]) for k in range(procs)]


def client_procs(tok_s: float, per_proc: float = 2000.0, most: int = 8) -> int:
    """Client processes for an expected ``tok_s`` streamed chunks a second: each asyncio loop
    timestamps at most ``per_proc`` chunks a second, so a busy client never reads as latency."""
    return max(1, min(most, math.ceil(tok_s / per_proc)))


# ---- one client process ------------------------------------------------------------------------


async def _open(base: str, model: str, arrivals: Sequence[Arrival], isl: int, osl: int, t_start: float, tag: str, drain_s: float) -> list[Result]:
    host, port = base.removeprefix("http://").split(":")
    running: list[tuple[Result, asyncio.Task[Result]]] = []
    for idx, at in arrivals:
        due = t_start + at
        delay = due - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        res = Result(index=idx, prompt_len=isl, scheduled=due)
        task = asyncio.ensure_future(_one(host, int(port), model, idx, isl, osl, tag, prompt=unique_prompt(idx, isl), res=res, count_tokens=True))
        running.append((res, task))
    if running:
        _, pending = await asyncio.wait([t for _, t in running], timeout=drain_s)
        for res, task in running:
            if task in pending:
                task.cancel()
                res.error = f"unfinished {drain_s:.0f} s after the last arrival"
                res.end = time.time()
    return [res for res, _ in running]


async def _closed(
    base: str, model: str, lanes: Sequence[tuple[int, float]], concurrency: int, first: int, isl: int, osl: int, stop_at: float, tag: str
) -> list[Result]:
    host, port = base.removeprefix("http://").split(":")
    out: list[Result] = []

    async def lane(k: int, start_at: float) -> None:
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        i = first + k
        while time.time() < stop_at:
            res = Result(index=i, prompt_len=isl, scheduled=time.time())
            out.append(res)
            await _one(host, int(port), model, i, isl, osl, tag, prompt=unique_prompt(i, isl), res=res, count_tokens=True)
            i += concurrency

    await asyncio.gather(*(lane(k, at) for k, at in lanes))
    return out


def _open_worker(args: tuple[str, str, list[Arrival], int, int, float, str, float]) -> list[dict[str, Any]]:
    return [r.__dict__ for r in asyncio.run(_open(*args))]


def _closed_worker(args: tuple[str, str, list[tuple[int, float]], int, int, int, int, float, str]) -> list[dict[str, Any]]:
    return [r.__dict__ for r in asyncio.run(_closed(*args))]


# ---- a segment -----------------------------------------------------------------------------------


def run_open(
    base: str, model: str, arrivals: Sequence[Arrival], isl: int, osl: int, tag: str, procs: int, drain_s: float = 30.0, lead_s: float = 0.4
) -> tuple[list[Result], float]:
    """Send ``arrivals`` (their offsets from a start ``lead_s`` ahead, once every client process
    is up) over ``procs`` processes; wait at most ``drain_s`` after the last arrival. Returns the
    results (requests cut at the drain limit carry an error) and the start (wall time)."""
    procs = max(1, min(procs, len(arrivals) or 1))
    shares = split(list(arrivals), procs)
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        t_start = time.time() + lead_s
        parts = pool.map(_open_worker, [(base, model, share, isl, osl, t_start, tag, drain_s) for share in shares])
    return [Result(**d) for part in parts for d in part], t_start


def run_closed_staggered(
    base: str,
    model: str,
    concurrency: int,
    first: int,
    isl: int,
    osl: int,
    seconds: float,
    stagger_s: float,
    tag: str,
    procs: int,
    lead_s: float = 0.4,
) -> tuple[list[Result], float]:
    """``concurrency`` lanes, each sending its next request when its last one ends, lane k
    starting ``k * stagger_s / concurrency`` after the start: the requests end spread over a
    request's length instead of together. Returns the results and the start (wall time)."""
    procs = max(1, min(procs, concurrency))
    lanes = [(k, k * stagger_s / concurrency) for k in range(concurrency)]
    shares = split(lanes, procs)
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        t_start = time.time() + lead_s
        stop_at = t_start + seconds
        work = [(base, model, [(k, t_start + at) for k, at in share], concurrency, first, isl, osl, stop_at, tag) for share in shares]
        parts = pool.map(_closed_worker, work)
    return [Result(**d) for part in parts for d in part], t_start


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 3)


def in_flight(results: Sequence[Result], t: float) -> int:
    """Requests planned (or sent) at or before ``t`` and not yet ended at ``t``."""
    return sum(1 for r in results if (r.scheduled if r.scheduled is not None else r.start) <= t < (r.end or math.inf))


def chunk_sizes(r: Result) -> list[int]:
    """Output tokens each chunk of ``r`` carried: from the running counts when every chunk had
    one, else one a chunk (a server that gave no counts)."""
    if r.chunk_tokens and len(r.chunk_tokens) == len(r.chunks):
        return [b - a for a, b in zip([0, *r.chunk_tokens], r.chunk_tokens, strict=False)]
    return [1] * len(r.chunks)


def summarise(results: Sequence[Result], t0: float, warm_s: float, seconds: float, raw: bool = True) -> dict[str, Any]:
    """One segment's figures over its steady window [t0 + warm_s, t0 + seconds): output tokens/s
    (the tokens of the chunks that arrived in the window, by the running counts vLLM sends with
    each chunk: an API server that falls behind merges a request's tokens into one chunk, so
    counting chunks undercounts, and undercounts the busier server more), TTFT of the requests
    planned in the window (first chunk minus the planned send time: the client's own lateness,
    ``lag``, counts against the server as a real user's would), the gaps between chunks whose
    later one arrived in the window (what a reader of the stream waits; ``tokens_per_chunk``
    says how often a gap held more than one token), time per output token of each request
    (first to last chunk over its tokens - 1: blind to merging), end-to-end latency, and the
    requests in flight at the window's start, middle and end
    (a queue that grows says the load was above what the server sustains). ``raw``: the
    per-request figures too (planned offset, lag, TTFT, end-to-end, tokens)."""
    a, b = t0 + warm_s, t0 + seconds
    span = b - a
    sizes = {id(r): chunk_sizes(r) for r in results}
    tokens = sum(k for r in results for t, k in zip(r.chunks, sizes[id(r)], strict=True) if a <= t < b)
    chunks = sum(1 for r in results for t in r.chunks if a <= t < b)
    itl = [y - x for r in results for x, y in zip(r.chunks, r.chunks[1:], strict=False) if a <= y < b]
    planned = [r for r in results if r.scheduled is not None and a <= r.scheduled < b]
    ttft = [r.chunks[0] - r.scheduled for r in planned if r.ok and r.chunks and r.scheduled is not None]
    tpot = [(r.chunks[-1] - r.chunks[0]) / (r.tokens - 1) for r in planned if r.ok and r.tokens > 1 and len(r.chunks) > 1]
    lag = [r.start - r.scheduled for r in planned if r.scheduled is not None and r.start]
    e2e = [r.end - r.scheduled for r in planned if r.ok and r.scheduled is not None]
    ok = [r for r in results if r.ok]
    errors = [r for r in results if r.error]
    per_chunk = sum(sum(sizes[id(r)]) for r in ok) / max(1, sum(len(r.chunks) for r in ok))
    counted = sum(1 for r in ok if r.chunk_tokens and len(r.chunk_tokens) == len(r.chunks))
    out: dict[str, Any] = {
        "window_s": round(span, 3),
        "requests": len(results),
        "planned_in_window": len(planned),
        "offered_req_s": round(len(planned) / span, 3) if span > 0 else None,
        "completed": len(ok),
        "errors": len(errors),
        "error_kinds": sorted({str(r.error)[:160] for r in errors})[:3],
        "tok_s": round(tokens / span, 2) if span > 0 else None,
        "chunks_s": round(chunks / span, 2) if span > 0 else None,
        "tokens_per_chunk": round(per_chunk, 4),
        "requests_with_token_counts": counted,
        "usage_matches_chunks": all(sum(sizes[id(r)]) == r.tokens for r in ok),
        "ttft_n": len(ttft),
        "ttft_p50_ms": _ms(quantile(ttft, 0.5)),
        "ttft_p90_ms": _ms(quantile(ttft, 0.9)),
        "ttft_p99_ms": _ms(quantile(ttft, 0.99)),
        "ttft_max_ms": _ms(max(ttft) if ttft else None),
        "itl_n": len(itl),
        "itl_p50_ms": _ms(quantile(itl, 0.5)),
        "itl_p90_ms": _ms(quantile(itl, 0.9)),
        "itl_p99_ms": _ms(quantile(itl, 0.99)),
        "itl_p999_ms": _ms(quantile(itl, 0.999)),
        "itl_max_ms": _ms(max(itl) if itl else None),
        "tpot_p50_ms": _ms(quantile(tpot, 0.5)),
        "tpot_p99_ms": _ms(quantile(tpot, 0.99)),
        "e2e_p50_ms": _ms(quantile(e2e, 0.5)),
        "e2e_p99_ms": _ms(quantile(e2e, 0.99)),
        "lag_p50_ms": _ms(quantile(lag, 0.5)),
        "lag_p99_ms": _ms(quantile(lag, 0.99)),
        "lag_max_ms": _ms(max(lag) if lag else None),
        "in_flight": {"start": in_flight(results, a), "middle": in_flight(results, (a + b) / 2), "end": in_flight(results, b)},
    }
    if raw:
        rows = sorted(planned, key=lambda r: r.scheduled or 0.0)
        out["per_request"] = {
            "planned_s": [round((r.scheduled or 0.0) - t0, 4) for r in rows],
            "lag_ms": [_ms(r.start - r.scheduled) if r.start and r.scheduled else None for r in rows],
            "ttft_ms": [_ms(r.chunks[0] - r.scheduled) if r.chunks and r.scheduled else None for r in rows],
            "e2e_ms": [_ms(r.end - r.scheduled) if r.ok and r.scheduled else None for r in rows],
            "tokens": [r.tokens if r.ok else len(r.chunks) for r in rows],
        }
    return out


def mean_latency(results: Sequence[Result]) -> float | None:
    """Mean end-to-end time of the completed requests (seconds), from their send."""
    xs = [r.end - r.start for r in results if r.ok and r.end and r.start]
    return sum(xs) / len(xs) if xs else None
