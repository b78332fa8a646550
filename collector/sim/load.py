"""A node-sized load for sizing the sidecar: N simulated vLLM engines, each stepping S times a
second with R running requests, written through the recorder channel as vLLM's adapters write.

Per engine, two writing processes as on a real node: the API server's stat logger (``stats``
ring: meta, fingerprint, one ``S`` record per step) and the engine core's scheduler (``sched``
ring: meta, fingerprint, one ``R`` record per step). Their pids are simulated (distinct per
engine, so an Xid line naming an engine's API server pid routes to that engine), the writing
process is this one.

The workload is a closed loop, as a benchmark client with ``--max-concurrency R`` drives a
server: each request gets a prompt of about ``isl`` tokens (chunked prefill, ``chunk`` tokens
a step), then one output token a step up to about ``osl``; when it finishes, the next one
arrives in its slot. Request ids have vLLM's completion form ``cmpl-<32 hex>-0``.

Cost: the simulator must stay a small share of a core while it drives 8 x 100 steps/s x 256
requests, so per step it does no Python work per request. The computed and output columns are
each one big integer of packed u32 lanes (``Lanes``): one addition moves every decoding request
a token, ``to_bytes`` is the column; only the few requests in prefill are added to one by one,
and the id and prompt columns are re-encoded only when a request arrives or finishes.

The rings are written through the engine-side recorder API (``collector.sim.load_rings``);
with a recorder version before that API, through that version's channel, so the node
benchmark can drive an older sidecar with this same load.
"""

from __future__ import annotations

import heapq
import json
import random
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.channel.codec import STATUS_CODE
from collector.sim.load_rings import EngineRings, open_rings

VLLM_VERSION = "0.11.1rc2.dev147+g3b5d6a1.sim"
MODEL = "deepseek-ai/DeepSeek-V3.2-Exp"
FIRST_PID = 41_000  # simulated API server pids: FIRST_PID + 100 * engine, its engine core + 1
_RUNNING = STATUS_CODE["running"]


@dataclass(frozen=True)
class LoadConfig:
    recorder_dir: Path
    engines: int = 1
    running: int = 256
    steps_per_second: float = 100.0
    duration: float | None = None  # None: until stopped
    isl: int = 1024
    osl: int = 256
    chunk: int = 2048  # prefill tokens per request per step (the chunked-prefill budget)
    block_size: int = 64
    name: str | None = None  # engine name base (FLIGHTREC_ENGINE_NAME); None: vllm-<pid>
    model: str = MODEL
    seed: int = 0
    workload_records: bool = True  # workload arrive/end records (readers before them count them bad)

    def engine_name(self, index: int) -> str:
        if self.name is None:
            return f"vllm-{api_pid(index)}"
        return f"{self.name}-{index}" if self.engines > 1 else self.name


def api_pid(index: int) -> int:
    return FIRST_PID + 100 * index


def fingerprint_facts(cfg: LoadConfig, index: int, port: int | None) -> dict[str, Any]:
    """A plain deployment (no KV connector, released vLLM's defaults: full and piecewise CUDA
    graphs, async scheduling), as the recorder reads it from vLLM's config."""
    from collector.sim import deployment

    config = deployment.vllm_config(
        model=cfg.model,
        tp=1,
        block_size=cfg.block_size,
        max_num_seqs=max(cfg.running, 256),
        max_model_len=4 * (cfg.isl + cfg.osl),
        cudagraph_mode=deployment.CUDAGraphMode.FULL_AND_PIECEWISE,
    )
    return deployment.fingerprint(config, vllm_version=VLLM_VERSION, environ={"CUDA_VISIBLE_DEVICES": str(index % 8)}, pid=api_pid(index), port=port)


@dataclass
class Counters:
    steps: int = 0
    step_records: int = 0  # the halves written: a stats and a requests record a step, the stats alone for the shutdown's aborts
    request_rows: int = 0
    arrived: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


class Lanes:
    """``n`` unsigned 32-bit columns packed into one Python int, lane ``i`` at bits 32i..32i+31.

    Adding a mask with a 1 in every growing lane moves all of them a token in one big-int
    addition (no carry crosses a lane while values stay below 2**32), and ``to_bytes`` is the
    ``u32[n]`` little-endian column of an ``R`` record: per step, no Python loop over requests.
    """

    __slots__ = ("n", "value")

    def __init__(self, n: int) -> None:
        self.n = n
        self.value = 0

    def get(self, i: int) -> int:
        return (self.value >> (32 * i)) & 0xFFFFFFFF

    def set(self, i: int, v: int) -> None:
        self.value += (v - self.get(i)) << (32 * i)

    def tobytes(self) -> bytes:
        return self.value.to_bytes(4 * self.n, "little")


class EngineLoad:
    """One engine's requests and its two rings. ``step()`` writes one step to both."""

    def __init__(self, cfg: LoadConfig, index: int, *, port: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.index, self.clock = cfg, index, clock
        self.name = cfg.engine_name(index)
        self.rng = random.Random(cfg.seed * 7919 + index)
        self.rings: EngineRings = open_rings(
            cfg.recorder_dir,
            server_pid=api_pid(index),
            port=port,
            name=cfg.name and self.name,
            default_name=self.name,
            version=VLLM_VERSION,
            workload_records=cfg.workload_records,
        )
        self.name = self.rings.engine
        self.rings.fingerprint(fingerprint_facts(cfg, index, port), clock())
        n = cfg.running
        self.step_no = 0
        self.running_now = n  # what its gauges say it holds: cfg.running under load, 0 once drained
        self.last_kv_usage = 0.0
        self.counters = Counters()
        self.kv_capacity_tokens = int(n * (cfg.isl + cfg.osl) * 1.25)
        self.ids: list[str] = [""] * n
        self.prompt = array("I", bytes(4 * n))
        self.max_tokens = [0] * n
        self.computed = Lanes(n)
        self.output = Lanes(n)
        self._grow = 0  # a 1 in the lane of every decoding request
        self.held_tokens = 0  # sum of the computed column
        self.prefilling: dict[int, int] = {}  # slot -> prompt tokens computed so far
        self._ends: list[tuple[int, int]] = []  # (step it is gone from running, slot) heap
        self._ids_blob = b""
        self._prompt_bytes = b""
        self._zeros = bytes(4 * n)
        self._status = bytes([_RUNNING]) * n
        now = clock()
        for slot in range(n):
            # Start in steady state: requests at every stage of decoding, as on a busy server.
            self._admit(slot, now, progress=self.rng.random())
        self._encode_static()

    # -- workload ----------------------------------------------------------------------------
    def _new_id(self) -> str:
        return f"cmpl-{self.rng.getrandbits(128):032x}-0"

    def _admit(self, slot: int, now: float, progress: float = 0.0) -> None:
        cfg, rng = self.cfg, self.rng
        prompt = max(1, int(cfg.isl * rng.uniform(0.5, 1.5)))
        max_tokens = max(1, int(cfg.osl * rng.uniform(0.5, 1.5)))
        rid = self._new_id()
        self.ids[slot] = rid
        self.prompt[slot] = prompt
        self.max_tokens[slot] = max_tokens
        self.counters.arrived += 1
        if progress > 0.0:  # already decoding, with `done` output tokens (the last not computed)
            done = max(1, min(max_tokens - 1, int(progress * max_tokens)))
            self.computed.set(slot, prompt + done - 1)
            self.held_tokens += prompt + done - 1
            self._decode_from(slot, done)
            return
        self.prefilling[slot] = 0
        self.rings.arrival(rid, now, prompt, max_tokens)

    def _decode_from(self, slot: int, output: int) -> None:
        """The request decodes from this step on: one computed and one output token a step,
        until its output reaches ``max_tokens``; the step after, it is gone from running."""
        self.output.set(slot, output)
        self._grow += 1 << (32 * slot)
        heapq.heappush(self._ends, (self.step_no + self.max_tokens[slot] - output + 1, slot))

    def _finish(self, slot: int, now: float) -> None:
        rid, out = self.ids[slot], self.max_tokens[slot]
        self.counters.finished += 1
        self._grow -= 1 << (32 * slot)
        self.held_tokens -= self.computed.get(slot)
        self.computed.set(slot, 0)
        self.output.set(slot, 0)
        self.rings.end(rid, now, out, "length")

    def _encode_static(self) -> None:
        self._ids_blob = "\0".join(self.ids).encode()
        self._prompt_bytes = self.prompt.tobytes()

    def drain(self) -> None:
        """The load is over: its requests end (the client went away) and one last step says it
        holds none, as a real engine's last step does. An idle engine is not a wedged one."""
        if self.running_now == 0:
            return
        now = self.clock()
        for slot in range(self.cfg.running):
            self.rings.end(self.ids[slot], now, self.output.get(slot), "abort")
        self.step_no += 1
        self.rings.step(
            self.step_no, now, running=0, kv_cache_usage=0.0, prompt_tokens=0, generation_tokens=0, finished=self.cfg.running, extras=None
        )
        self.counters.steps += 1  # aborted, not finished: vLLM's success counter does not count them
        self.counters.step_records += 1  # nothing scheduled: no requests half, as a scheduler with nothing to run writes none
        self.running_now = 0
        self.last_kv_usage = 0.0

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> None:
        self.step_no += 1
        step = self.step_no
        now = self.clock()
        cfg = self.cfg
        n = cfg.running
        finished_n = 0
        ends = self._ends
        while ends and ends[0][0] <= step:
            _, slot = heapq.heappop(ends)
            self._finish(slot, now)
            self._admit(slot, now)
            finished_n += 1
        if finished_n:
            self._encode_static()
        decoding = n - len(self.prefilling)
        self.computed.value += self._grow
        self.output.value += self._grow
        prompt_tokens = 0
        for slot, done in list(self.prefilling.items()):
            k = min(cfg.chunk, self.prompt[slot] - done)
            self.computed.value += k << (32 * slot)
            prompt_tokens += k
            if done + k >= self.prompt[slot]:  # the step that ends prefill samples the first token
                del self.prefilling[slot]
                self._decode_from(slot, 1)
            else:
                self.prefilling[slot] = done + k
        self.held_tokens += decoding + prompt_tokens
        generation_tokens = n - len(self.prefilling)
        kv = min(1.0, -(-self.held_tokens // cfg.block_size) * cfg.block_size / self.kv_capacity_tokens)
        self.last_kv_usage = kv
        # the stat logger counts a step's finished requests; their ends are the workload records
        self.rings.step(
            step,
            now,
            running=n,
            kv_cache_usage=kv,
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            finished=finished_n,
            extras=None,
        )
        self.rings.requests(
            step, now, n, self._ids_blob, self._prompt_bytes, self.computed.tobytes(), self.output.tobytes(), self._zeros, self._status
        )
        c = self.counters
        c.steps += 1
        c.step_records += 2
        c.request_rows += n
        c.prompt_tokens += prompt_tokens
        c.generation_tokens += generation_tokens

    def close(self) -> None:
        self.rings.close()


@dataclass
class RunReport:
    wall_s: float
    cpu_s: float
    steps: int
    request_rows: int
    finished: int
    target_steps_per_s: float
    max_lag_s: float
    late_steps: int
    per_engine: dict[str, int] = field(default_factory=dict)
    step_records: int | None = None  # the halves written (a stats and a requests record a step, less the aborts' requests half)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.request_rows / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "cpu_share": round(self.cpu_share, 4),
            "steps": self.steps,
            "step_records": self.step_records,
            "request_rows": self.request_rows,
            "finished": self.finished,
            "steps_per_s": round(self.steps_per_s, 1),
            "rows_per_s": round(self.rows_per_s, 1),
            "target_steps_per_s": self.target_steps_per_s,
            "max_lag_s": round(self.max_lag_s, 4),
            "late_steps": self.late_steps,
            "per_engine_steps": self.per_engine,
        }

    def lines(self) -> list[str]:
        return [
            (
                f"wall {self.wall_s:.1f} s, {self.steps} steps ({self.steps_per_s:.1f}/s of {self.target_steps_per_s:g} "
                f"target), {self.request_rows} request rows ({self.rows_per_s:.0f}/s), {self.finished} requests finished"
            ),
            (
                f"simulator CPU {self.cpu_s:.2f} s = {100 * self.cpu_share:.1f}% of one core; "
                f"late steps {self.late_steps} (> 1 period), max lag {1000 * self.max_lag_s:.1f} ms"
            ),
        ]


class Pacer:
    """Absolute deadlines: slot ``j`` is due at ``t0 + j / rate``, so sleeping late never
    accumulates drift; a late slot runs at once (and is counted), it is never skipped."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.period = 1.0 / rate
        self.clock, self.sleep = clock, sleep
        self.t0 = clock()
        self.slot = 0
        self.max_lag = 0.0
        self.late = 0

    def wait(self) -> int:
        """Block until the next slot is due; returns its index."""
        due = self.t0 + self.slot * self.period
        now = self.clock()
        if due > now:
            self.sleep(due - now)
            now = self.clock()
        lag = now - due
        self.max_lag = max(self.max_lag, lag)
        if lag > self.period:
            self.late += 1
        slot = self.slot
        self.slot += 1
        return slot


def run(
    engines: list[EngineLoad],
    cfg: LoadConfig,
    stop: threading.Event,
    progress: Callable[[RunReport], None] | None = None,
    progress_every: float = 10.0,
) -> RunReport:
    """Step the engines round-robin (engine ``i`` half a period apart from ``i+1``) until
    ``stop`` is set or the duration has passed; then each engine's last step, holding nothing
    (``EngineLoad.drain``), counted with the rest."""
    pacer = Pacer(cfg.steps_per_second * len(engines))
    cpu0, t0 = time.process_time(), time.monotonic()
    end = None if cfg.duration is None else t0 + cfg.duration
    next_progress = t0 + progress_every
    n = len(engines)

    def report() -> RunReport:
        return RunReport(
            wall_s=time.monotonic() - t0,
            cpu_s=time.process_time() - cpu0,
            steps=sum(e.counters.steps for e in engines),
            request_rows=sum(e.counters.request_rows for e in engines),
            finished=sum(e.counters.finished for e in engines),
            target_steps_per_s=cfg.steps_per_second * n,
            max_lag_s=pacer.max_lag,
            late_steps=pacer.late,
            per_engine={e.name: e.counters.steps for e in engines},
            step_records=sum(e.counters.step_records for e in engines),
        )

    while not stop.is_set():
        slot = pacer.wait()
        now = time.monotonic()
        if end is not None and now >= end:
            break
        engines[slot % n].step()
        if progress is not None and now >= next_progress:
            next_progress += progress_every
            progress(report())
    for e in engines:  # the load is over: idle engines hold nothing (a wedged one would); counted
        e.drain()
    return report()


def config_document(cfg: LoadConfig, engines: list[EngineLoad], urls: dict[str, str]) -> dict[str, Any]:
    """The sidecar settings (``collector.settings``) that watch these engines."""
    doc: dict[str, Any] = {"recorder_dir": str(cfg.recorder_dir), "nvml": "off"}
    doc["engines"] = [{"name": e.name, "url": urls[e.name]} for e in engines if e.name in urls]
    return doc


def summary_json(report: RunReport) -> str:
    return json.dumps(report.to_dict(), sort_keys=True)
