"""The coarse series the shared store keeps: per engine and per GPU, one row per interval
(``fleet_series_interval_s``, 10 s by default) made on the node from its steps and GPU samples.

At 100 steps/s per engine a node sends 800 step rows/s; its coarse series is 1.6 rows/s (8
engines and 8 GPUs every 10 s), 500 times fewer, which is what lets 1,000 nodes share one
Postgres (docs/fleet.md). What a fleet dashboard asks of it: load (running, waiting, tokens),
KV pressure (average and peak usage, preemptions), the GPUs' heat, power, clocks and errors.

An interval's row is made once it has closed (its end plus ``grace_s`` has passed on the wall
clock). A step that comes later for it (a sidecar restarted within the interval, a ring read
late) makes a second row of the same interval, told apart by ``part``, a number no other row of
this node has (a random run id and a counter): the figures are sums, counts and maxima, so a
reader adds an interval's rows up, and a row shipped twice (the outbox after a kill) is stored
once. Unknown stays unknown: a figure no step carried is NULL, not 0.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from collector.model import GpuSample

# The step tuple's fields this module reads (collector/storage/repo.py STEP_TUPLE order):
# engine, ts, step, run, running, waiting, kv_cache_usage, preemptions, prompt_tokens,
# generation_tokens, mirror_rows, host_blocks.
_ENGINE, _TS, _RUNNING, _WAITING, _KV, _PREEMPT, _PROMPT, _GEN, _MIRROR = 0, 1, 4, 5, 6, 7, 8, 9, 10


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else (a if b is None else a + b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else (a if b is None else max(a, b))


def _min(a: Any, b: Any) -> Any:
    return b if a is None else (a if b is None else min(a, b))


@dataclass
class _EngineAcc:
    steps: int = 0
    running_sum: float = 0.0
    running_n: int = 0
    running_max: int | None = None
    waiting_max: int | None = None
    kv_sum: float = 0.0
    kv_n: int = 0
    kv_max: float | None = None
    preemptions: int | None = None
    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    mirror_max: int | None = None


@dataclass
class _GpuAcc:
    samples: int = 0
    util_sum: float = 0.0
    util_n: int = 0
    power_sum: float = 0.0
    power_n: int = 0
    memory_max: int | None = None
    temperature_max: float | None = None
    sm_clock_min: float | None = None
    reasons: int | None = None
    ecc_max: int | None = None
    remapped_max: int | None = None
    pcie_max: int | None = None


class Coarsener:
    """Accumulates steps (as ``STEP_TUPLE`` tuples) and GPU samples into intervals; ``closed``
    hands over the rows of intervals that have ended."""

    def __init__(self, *, host: str, interval_s: float = 10.0, grace_s: float = 2.0) -> None:
        self.host = host
        self.interval_s = interval_s
        self.grace_s = grace_s
        self._engines: dict[tuple[str, float], _EngineAcc] = {}
        self._gpus: dict[tuple[str, float], _GpuAcc] = {}
        self._parts = itertools.count((secrets.randbits(31) << 32) + 1)

    def _start(self, ts: float) -> float:
        return math.floor(ts / self.interval_s) * self.interval_s

    def add_steps(self, tuples: Iterable[tuple[Any, ...]]) -> None:
        accs = self._engines
        for t in tuples:
            key = (t[_ENGINE], self._start(t[_TS]))
            a = accs.get(key)
            if a is None:
                a = accs[key] = _EngineAcc()
            a.steps += 1
            running = t[_RUNNING]
            if running is not None:
                a.running_sum += running
                a.running_n += 1
                a.running_max = _max(a.running_max, running)
            a.waiting_max = _max(a.waiting_max, t[_WAITING])
            kv = t[_KV]
            if kv is not None:
                a.kv_sum += kv
                a.kv_n += 1
                a.kv_max = _max(a.kv_max, kv)
            a.preemptions = _add(a.preemptions, t[_PREEMPT])
            a.prompt_tokens = _add(a.prompt_tokens, t[_PROMPT])
            a.generation_tokens = _add(a.generation_tokens, t[_GEN])
            a.mirror_max = _max(a.mirror_max, t[_MIRROR])

    def add_gpu(self, samples: Iterable[GpuSample]) -> None:
        accs = self._gpus
        for s in samples:
            key = (s.gpu, self._start(s.ts))
            a = accs.get(key)
            if a is None:
                a = accs[key] = _GpuAcc()
            a.samples += 1
            if s.utilization is not None:
                a.util_sum += s.utilization
                a.util_n += 1
            if s.power_w is not None:
                a.power_sum += s.power_w
                a.power_n += 1
            a.memory_max = _max(a.memory_max, s.memory_used)
            a.temperature_max = _max(a.temperature_max, s.temperature)
            a.sm_clock_min = _min(a.sm_clock_min, s.sm_clock_mhz)
            if s.clock_event_reasons is not None:
                a.reasons = (a.reasons or 0) | s.clock_event_reasons
            a.ecc_max = _max(a.ecc_max, s.ecc_volatile_uncorrected)
            a.remapped_max = _max(a.remapped_max, s.remapped_rows_uncorrectable)
            a.pcie_max = _max(a.pcie_max, s.pcie_replay)

    @property
    def open_intervals(self) -> int:
        return len(self._engines) + len(self._gpus)

    def closed(self, now: float, *, everything: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The rows (engine_series, gpu_series) of the intervals that ended ``grace_s`` before
        ``now`` (all of them with ``everything``, at stop), removed from what is held."""
        cutoff = now - self.grace_s - self.interval_s
        engines = [k for k in self._engines if everything or k[1] <= cutoff]
        gpus = [k for k in self._gpus if everything or k[1] <= cutoff]
        span = self.interval_s
        e_rows = []
        for key in engines:
            a = self._engines.pop(key)
            e_rows.append(
                {
                    "host": self.host,
                    "engine": key[0],
                    "ts": key[1],
                    "part": next(self._parts),
                    "span_s": span,
                    "steps": a.steps,
                    "running_sum": a.running_sum if a.running_n else None,
                    "running_samples": a.running_n,
                    "running_max": a.running_max,
                    "waiting_max": a.waiting_max,
                    "kv_cache_usage_sum": a.kv_sum if a.kv_n else None,
                    "kv_cache_usage_samples": a.kv_n,
                    "kv_cache_usage_max": a.kv_max,
                    "preemptions": a.preemptions,
                    "prompt_tokens": a.prompt_tokens,
                    "generation_tokens": a.generation_tokens,
                    "mirror_rows_max": a.mirror_max,
                }
            )
        g_rows = []
        for key in gpus:
            g = self._gpus.pop(key)
            g_rows.append(
                {
                    "host": self.host,
                    "gpu": key[0],
                    "ts": key[1],
                    "part": next(self._parts),
                    "span_s": span,
                    "samples": g.samples,
                    "utilization_sum": g.util_sum if g.util_n else None,
                    "utilization_samples": g.util_n,
                    "memory_used_max": g.memory_max,
                    "temperature_max": g.temperature_max,
                    "power_w_sum": g.power_sum if g.power_n else None,
                    "power_w_samples": g.power_n,
                    "sm_clock_mhz_min": g.sm_clock_min,
                    "clock_event_reasons": g.reasons,
                    "ecc_volatile_uncorrected_max": g.ecc_max,
                    "remapped_rows_uncorrectable_max": g.remapped_max,
                    "pcie_replay_max": g.pcie_max,
                }
            )
        return e_rows, g_rows
