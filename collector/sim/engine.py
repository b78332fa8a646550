"""One simulated vLLM engine (prefill or decode): its scheduler state, its step records
(written to ring files exactly as the in-engine recorder writes them), its /metrics and
/health, and its log."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector.channel import RingWriter
from collector.channel.naming import ring_file_name
from collector.channel.codec import encode, encode_fingerprint, encode_requests, encode_step
from collector.model import Fingerprint, RequestRow, StepRecord
from collector.sim import vllm_logs
from collector.sim.metrics import VllmMetrics
from collector.sim.scenario import Scenario, SimRequest

VERSION = "0.11.1rc2.dev147+g3b5d6a1.sim"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def fingerprint_facts(name: str, role: str, sc: Scenario, port: int, gpu_index: int, pid: int) -> dict[str, Any]:
    """The deployment facts of the incident, keyed as the recorder reports them."""
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    return {
        "vllm_version": VERSION,
        "model": sc.model,
        "served_model_name": sc.model,
        "tensor_parallel_size": sc.tp,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "engine_index": 0,
        "block_size": sc.block_size,
        "kv_transfer_config": {
            "kv_connector": "MultiConnector",
            "kv_role": kv_role,
            "kv_connector_extra_config": {
                "connectors": [
                    {"kv_connector": "NixlConnector", "kv_role": kv_role},
                    {"kv_connector": "HiSparseConnector", "kv_role": kv_role,
                     "kv_connector_extra_config": {"host_pool_size": "128GiB", "import_prefix_via_host": True}},
                ]
            },
        },  # fmt: skip
        "connectors": ["MultiConnector", "NixlConnector", "HiSparseConnector"],
        "kv_role": kv_role,
        "host_pool_size": sc.host_pool_bytes,
        "import_prefix_via_host": True,
        "cuda_graph_mode": "FULL",
        "compilation_mode": 3,
        "enforce_eager": False,
        "max_num_seqs": 16,
        "max_model_len": 40960,
        "env": {
            "CUDA_LAUNCH_BLOCKING": "0",
            "NCCL_NET_PLUGIN": "none",
            "NCCL_DEBUG": "WARN",
            "VLLM_USE_V1": "1",
            "CUDA_VISIBLE_DEVICES": str(gpu_index),
            "HF_TOKEN": "***",
        },
        "hostname": "sim-node",
        "pid": pid,  # the simulated API server's
        "role": role,
        "port": port,
        "simulated": True,
    }


class SimEngine:
    def __init__(
        self,
        *,
        name: str,
        role: str,
        scenario: Scenario,
        port: int,
        recorder_dir: Path,
        log_path: Path,
        gpu_index: int,
        fake_pid: int,
        host: str = "127.0.0.1",
    ) -> None:
        self.name, self.role, self.sc, self.port, self.host = name, role, scenario, port, host
        self.gpu_index = gpu_index
        self.pids = {"APIServer": fake_pid, "EngineCore_DP0": fake_pid + 150,
                     "Worker_TP0": fake_pid + 300, "Worker_TP1": fake_pid + 301}  # fmt: skip
        self.metrics = VllmMetrics(engine_index=0, model_name=scenario.model)
        recorder_dir.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        self.stats_ring = RingWriter(recorder_dir / ring_file_name(name, "stats", pid), capacity=4 << 20)
        self.sched_ring = RingWriter(recorder_dir / ring_file_name(name, "sched", pid), capacity=16 << 20)
        for ring, rrole in ((self.stats_ring, "stats"), (self.sched_ring, "sched")):
            ring.append(encode({"t": "meta", "engine": name, "engine_index": 0, "role": rrole, "pid": pid,
                                "vllm_version": VERSION}))  # fmt: skip
        self.facts = fingerprint_facts(name, role, scenario, port, gpu_index, fake_pid)
        self.stats_ring.append(encode_fingerprint(Fingerprint(engine=name, ts=time.time(), facts=self.facts)))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log: TextIO = open(log_path, "a", buffering=1)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.step_counter = 0
        self.alive = True
        self.http_up = False
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._window_tokens = (0, 0, time.time())  # prompt, generation, since
        self.routes: list[Callable[[FastAPI], None]] = []  # more endpoints (collector.sim.openai)
        self.write("APIServer", "INFO", "api_server.py:1880", f"vLLM API server version {VERSION}")
        self.write("APIServer", "INFO", "api_server.py:1881", f"args: model='{scenario.model}', port={port}, "
                   f"tensor_parallel_size={scenario.tp}, block_size={scenario.block_size}")  # fmt: skip

    # -- log ---------------------------------------------------------------------------------
    def write(self, process: str, level: str, where: str, msg: str, ts: float | None = None) -> None:
        self.log.write(vllm_logs.line(process, self.pids[process], level, ts or time.time(), where, msg) + "\n")

    def write_lines(self, lines: list[str]) -> None:
        self.log.write("\n".join(lines) + "\n")

    def log_throughput(self) -> None:
        p, g, since = self._window_tokens
        now = time.time()
        dt = max(now - since, 1e-3)
        self._window_tokens = (0, 0, now)
        msg = vllm_logs.throughput(0, p / dt, g / dt, len(self.running), len(self.waiting), self.kv_usage(), 0.0)
        self.write("APIServer", "INFO", "loggers.py:236", msg)

    # -- HTTP --------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/metrics")
        def metrics() -> Response:
            return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

        @app.get("/health")
        def health() -> Response:
            return Response(status_code=200 if self.alive else 503)

        for add in self.routes:
            add(app)
        return app

    async def start_http(self) -> None:
        cfg = uvicorn.Config(self.app(), host=self.host, port=self.port, log_level="error", access_log=False, lifespan="off")
        self._server = _Server(cfg)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            raise RuntimeError(f"simulated engine {self.name} cannot listen on port {self.port}")
        self.http_up = True
        if self.port == 0:
            self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop_http(self) -> None:
        if self._server is not None and self.http_up:
            self._server.should_exit = True
            if self._task is not None:
                await self._task
            self.http_up = False

    # -- scheduling --------------------------------------------------------------------------
    def kv_usage(self) -> float:
        sc = self.sc
        if self.role == "decode":
            held = sum(min(r.context_len, sc.device_window_tokens) for r in self.running)
            blocks = sum(math.ceil(min(r.context_len, sc.device_window_tokens) / sc.block_size) for r in self.running)
            return round(blocks * sc.block_size / sc.decode_kv_capacity_tokens, 6) if held else 0.0
        held = sum(r.computed for r in self.running)
        return round(held / sc.prefill_kv_capacity_tokens, 6)

    def mirror_rows(self, r: SimRequest) -> int:
        """Host-mirror rows the sparse connector holds for a request: every block beyond the
        device window is mirrored in the host pool."""
        return max(0, math.ceil((r.context_len - self.sc.device_window_tokens) / self.sc.block_size))

    def step(self) -> tuple[list[SimRequest], int]:
        """One engine step. Returns (requests that left this engine, tokens computed)."""
        sc = self.sc
        self.step_counter += 1
        out: list[SimRequest] = []
        prompt = gen = 0
        if self.role == "prefill":
            while self.waiting and len(self.running) < 16:
                r = self.waiting.pop(0)
                r.status = "running"
                self.running.append(r)
            budget = sc.prefill_chunk
            for r in self.running:
                if budget <= 0:
                    break
                n = min(budget, r.prompt_len - r.computed)
                r.computed += n
                budget -= n
                prompt += n
            for r in [r for r in self.running if r.computed >= r.prompt_len]:
                self.running.remove(r)
                r.output = 1  # the first token comes from the prefill engine
                out.append(r)
        else:
            for r in [r for r in self.waiting if r.ready_at_step <= self.step_counter]:
                self.waiting.remove(r)
                r.status = "running"
                self.running.append(r)
            for r in self.running:
                r.output += 1
                gen += 1
            for r in [r for r in self.running if r.output >= r.max_tokens]:
                self.running.remove(r)
                r.status = "finished"
                out.append(r)
        self._record(prompt, gen, out)
        return out, prompt + gen

    def _record(self, prompt: int, gen: int, finished: list[SimRequest]) -> None:
        now = time.time()
        m = self.metrics
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.waiting_capacity.set(len(self.waiting))
        usage = self.kv_usage()
        m.kv_usage.set(usage)
        if prompt:
            m.prompt_tokens.inc(prompt)
        if gen:
            m.generation_tokens.inc(gen)
            m.itl.observe(0.025)
        m.iteration_tokens.observe(prompt + gen)
        if self.role == "decode":
            m.success.inc(len(finished))
            for _ in finished:
                m.e2e.observe(self.sc.osl * 0.025 + 4.0)
        elif finished:
            for _ in finished:
                m.ttft.observe(4.0)
        p, g, since = self._window_tokens
        self._window_tokens = (p + prompt, g + gen, since)
        rows = [
            RequestRow(request_id=r.request_id, prompt_len=r.prompt_len,
                       computed_tokens=r.context_len - 1 if self.role == "decode" else r.computed,
                       output_tokens=r.output, preemptions=r.preemptions, status=r.status,
                       mirror_rows=self.mirror_rows(r) if self.role == "decode" else None)
            for r in self.running
        ]  # fmt: skip
        mirror_total = sum(x.mirror_rows or 0 for x in rows)
        connector: dict[str, Any] = {"nixl_num_failed_transfers": 0}
        if self.role == "decode":
            connector.update(mirror_rows=mirror_total,
                             host_pool_used_bytes=mirror_total * self.sc.block_size * 70272 // 64,
                             pending_page_transfers=len(self.waiting))  # fmt: skip
            m.host_cache.set(min(1.0, connector["host_pool_used_bytes"] / self.sc.host_pool_bytes))
            m.pending_pages.set(len(self.waiting))
        rec = StepRecord(
            engine=self.name, ts=now, step=self.step_counter, running=len(self.running), waiting=len(self.waiting),
            kv_cache_usage=usage, preemptions=0, prompt_tokens=prompt, generation_tokens=gen,
            finished=len(finished), waiting_by_reason={"capacity": len(self.waiting), "deferred": 0},
            connector=connector,
        )  # fmt: skip
        self.stats_ring.append(encode_step(rec))
        self.sched_ring.append(encode_requests(self.name, self.step_counter, now, rows))

    # -- workload (the recorder's ``wl`` records, as the scheduler writes them) ----------------
    def workload_arrive(self, r: SimRequest, *, max_tokens: int, ts: float | None = None) -> None:
        self.sched_ring.append(encode({"t": "wl", "ev": "arrive", "id": r.request_id, "ts": ts or time.time(),
                                       "prompt_len": r.prompt_len, "max_tokens": max_tokens, "n": 1,
                                       "ignore_eos": True, "has_stop": False}))  # fmt: skip

    def workload_end(self, r: SimRequest, *, output_len: int, finish: str = "length") -> None:
        # no prefix-cache hits: the incident's prompts did not repeat
        self.sched_ring.append(encode({"t": "wl", "ev": "end", "id": r.request_id, "ts": time.time(),
                                       "output_len": output_len, "finish": finish, "cached_tokens": 0}))  # fmt: skip

    def close(self) -> None:
        self.stats_ring.close()
        self.sched_ring.close()
        with contextlib.suppress(Exception):
            self.log.close()
