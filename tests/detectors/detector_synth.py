"""Synthetic series for detector tests: per-step records and scrapes with optional noise."""

from __future__ import annotations

import random
from collections.abc import Callable

from collector.model import GpuSample, MetricsScrape, StepRecord
from tests.request_columns import Row, with_rows


def steps(
    start: float,
    seconds: float,
    *,
    per_s: float = 20.0,
    running: Callable[[float], int] = lambda t: 8,
    waiting: Callable[[float], int] = lambda t: 0,
    kv: Callable[[float], float] = lambda t: 0.3,
    tokens: Callable[[float], int] = lambda t: 8,
    preemptions: Callable[[float], int] = lambda t: 0,
    mirror_rows: Callable[[float], int] | None = None,
    engine: str = "decode-0",
) -> list[StepRecord]:
    out = []
    n = int(seconds * per_s)
    for i in range(n):
        t = start + i / per_s
        rel = t - start
        record = StepRecord(
            engine=engine,
            ts=t,
            step=i,
            running=running(rel),
            waiting=waiting(rel),
            kv_cache_usage=kv(rel),
            generation_tokens=tokens(rel),
            preemptions=preemptions(rel),
        )
        if mirror_rows is not None:
            rows = mirror_rows(rel)
            k = max(1, record.running)
            record = with_rows(record, [Row(f"r{j}", 1000, 1000, mirror_rows=rows // k) for j in range(k)])
        out.append(record)
    return out


def scrapes(
    start: float, seconds: float, *, every: float = 1.0, engine: str = "decode-0", values: Callable[[float], dict[str, float]]
) -> list[MetricsScrape]:
    return [MetricsScrape(engine=engine, ts=start + i * every, values=values(i * every)) for i in range(int(seconds / every))]


def noisy(rng: random.Random, base: float, spread: float) -> float:
    return max(0.0, base + rng.uniform(-spread, spread))


def gpu(ts: float, **fields: object) -> GpuSample:
    return GpuSample(gpu="0000:00:06.0", index=0, ts=ts, **fields)  # type: ignore[arg-type]
