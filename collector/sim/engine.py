"""One simulated vLLM engine (prefill or decode): its scheduler state, its step records
(its running requests and workload written through the in-engine recorder's ``RequestRecorder``,
as vLLM's scheduler writes them), its /metrics and /health, and its log."""

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
from collector.channel.codec import encode, encode_fingerprint, encode_step
from collector.channel.naming import ring_file_name
from collector.model import Fingerprint, StepRecord
from collector.recorder import EngineIdentity, RequestRecorder, status_code
from collector.sim import deployment, vllm_logs
from collector.sim.load_rings import this_run
from collector.sim.metrics import VllmMetrics
from collector.sim.scenario import Scenario, SimRequest
from collector.vllm.extract import connector_stats as connector_record  # the stat logger's reader

VERSION = "0.11.1rc2.dev147+g3b5d6a1.sim"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


# DeepSeek-V3.2 on the host pool: 61 layers x (656 B of fp8 MLA latent + 132 B of indexer key)
# per token; the host holds whole 64-token pages.
HOST_BYTES_PER_TOKEN = 61 * (656 + 132)
# The worker snapshots HiSparse's hot-buffer hits and misses every 2,000 of its stats calls
# (one per step): `_METRICS_INTERVAL` in vLLM's hisparse/worker.py.
HISPARSE_METRICS_INTERVAL = 2000
HISPARSE_KEYS = (
    "cache_hits",
    "cache_misses",
    "host_to_device_bytes",
    "host_cache_usage_perc",
    "pending_page_transfers",
    "host_block_lifetime_seconds",
    "host_block_idle_before_evict_seconds",
    "host_block_reuse_gap_seconds",
)
NIXL_KEYS = (
    "transfer_duration",
    "post_duration",
    "bytes_transferred",
    "num_descriptors",
    "num_failed_transfers",
    "num_failed_notifications",
    "num_failed_handshakes",
    "num_kv_expired_reqs",
    "num_notifications_after_expiry",
)
SIM_ENV = {"CUDA_LAUNCH_BLOCKING": "0", "NCCL_NET_PLUGIN": "none", "NCCL_DEBUG": "WARN", "VLLM_USE_V1": "1"}


def engine_config(name: str, role: str, sc: Scenario) -> Any:
    """The incident's engine as vLLM's config holds it (``collector.sim.deployment``)."""
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    return deployment.vllm_config(
        model=sc.model,
        tp=sc.tp,
        block_size=sc.block_size,
        max_num_seqs=16,
        max_model_len=40960,
        # The incident's PR stack ran HiSparse with full CUDA graphs. Released vLLM refuses that
        # at start-up ("HiSparse does not support cudagraph_mode=FULL", vllm/config/vllm.py):
        # a released deployment runs FULL_AND_PIECEWISE or FULL_DECODE_ONLY.
        cudagraph_mode=deployment.CUDAGraphMode[sc.cudagraph_mode],
        kv_transfer=deployment.kv_transfer_config(kv_role, sc.host_pool_gib, deployment.engine_id(name)),
        device_buffer_size=sc.device_buffer_size,
        eager_host_mirror=sc.eager_host_mirror,
    )


def fingerprint_facts(name: str, role: str, sc: Scenario, port: int, gpu_index: int, pid: int) -> dict[str, Any]:
    """The deployment facts of the incident, as the recorder reads them from vLLM's config."""
    env = {**SIM_ENV, "CUDA_VISIBLE_DEVICES": str(gpu_index), "HF_TOKEN": "hf_simulated"}
    return deployment.fingerprint(engine_config(name, role, sc), vllm_version=VERSION, environ=env, pid=pid, port=port or None, name=name)


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
        self.pids = {"APIServer": fake_pid, "EngineCore_DP0": fake_pid + 150, "Worker_TP0": fake_pid + 300, "Worker_TP1": fake_pid + 301}
        self.metrics = VllmMetrics(engine_index=0, model_name=scenario.model, kv_consumer=role == "decode")
        recorder_dir.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        run = this_run()  # a new one per start, as a real engine's (its rings get new names)
        self.stats_ring = RingWriter(recorder_dir / ring_file_name(name, "stats", pid, run), capacity=4 << 20)
        self.stats_ring.append(
            encode({"t": "meta", "engine": name, "engine_index": 0, "role": "stats", "pid": pid, "vllm_version": VERSION, "run": run})
        )
        # the scheduler's ring, through the recorder vLLM's RecordingScheduler writes through
        self.sched = RequestRecorder(EngineIdentity(server_pid=pid, name=name, engine_version=VERSION, run=run), directory=recorder_dir, pid=pid)
        if not self.sched.active:
            raise OSError(f"recorder of simulated engine {name} failed: {self.sched.failed}")
        self.facts = fingerprint_facts(name, role, scenario, port, gpu_index, fake_pid) | {"run": run}  # as the recorder's identity adds it
        self.stats_ring.append(encode_fingerprint(Fingerprint(engine=name, ts=time.time(), facts=self.facts)))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log: TextIO = open(log_path, "a", buffering=1)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.step_counter = 0
        self.last_mirrors: dict[str, tuple[vllm_logs.RowMirror, ...]] = {}
        self.last_connector_stats: dict[str, dict[str, list[Any]]] = {}
        self._host_base: dict[str, int] = {}  # request -> its first host page
        self._host_next = 0
        self._device_slot: dict[str, int] = {}
        self.alive = True
        self.http_up = False
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._window_tokens = (0, 0, time.time())  # prompt, generation, since
        self.routes: list[Callable[[FastAPI], None]] = []  # more endpoints (collector.sim.openai)
        self.write("APIServer", "INFO", "api_server.py:1880", f"vLLM API server version {VERSION}")
        self.write(
            "APIServer",
            "INFO",
            "api_server.py:1881",
            f"args: model='{scenario.model}', port={port}, tensor_parallel_size={scenario.tp}, block_size={scenario.block_size}",
        )

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
            # the fingerprint names where the API server listens, once it does
            self.facts = fingerprint_facts(self.name, self.role, self.sc, self.port, self.gpu_index, self.pids["APIServer"]) | {
                "run": self.facts["run"]
            }
            self.stats_ring.append(encode_fingerprint(Fingerprint(engine=self.name, ts=time.time(), facts=self.facts)))

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

    def host_blocks(self, r: SimRequest) -> int:
        """Host pages the HiSparse coordinator holds for a request (its host manager's
        ``req_to_blocks``): with ``eager_host_mirror`` every page of its context, the prompt's
        KV having landed straight in host pages (external imports always do)."""
        tokens = r.context_len - 1 if self.role == "decode" else r.computed
        return math.ceil(tokens / self.sc.block_size)

    def row_mirrors(self, r: SimRequest, computed_now: int) -> tuple[vllm_logs.RowMirror, ...]:
        """This step's ``SparseKVRowMirror`` spans of a request (``HiSparseConnectorMetadata
        .row_mirrors``): the rows its forward writes, copied from its device hot buffer (one
        start per KV group: the MLA latent and the indexer key) to their rows in its host pages.
        A decode step writes one row (no speculative decoding), a prefill chunk its tokens: the
        work follows the batch, not what the host holds."""
        sc = self.sc
        if computed_now <= 0:
            return ()
        base = self._host_base.get(r.request_id)
        if base is None:
            base = self._host_base[r.request_id] = self._host_next
            self._host_next += math.ceil((r.prompt_len + r.max_tokens) / sc.block_size)
        slot = self._device_slot.setdefault(r.request_id, len(self._device_slot) % 64)
        first = (r.context_len - 1 if self.role == "decode" else r.computed) - computed_now
        rows = sc.device_rows_per_request
        dev = slot * rows + first % rows
        return (vllm_logs.RowMirror((dev, 64 * rows + dev), base * sc.block_size + first, computed_now),)

    def host_usage(self) -> float:
        blocks = sum(self.host_blocks(r) for r in self.running)
        return min(1.0, round(blocks * self.sc.block_size * HOST_BYTES_PER_TOKEN / self.sc.host_pool_bytes, 6))

    def connector_stats(self, landed: list[SimRequest]) -> dict[str, dict[str, list[Any]]]:
        """``SchedulerStats.kv_connector_stats`` of this step, as MultiConnector builds it: keyed
        by connector class, each connector's lists (HiSparse: deltas for hits, misses and bytes,
        levels for host usage and pending transfers; NIXL: one entry per finished transfer)."""
        out: dict[str, dict[str, list[Any]]] = {}
        if landed:  # the decode side pulled these prompts' KV from the prefill engine
            nixl: dict[str, list[Any]] = {k: [] for k in NIXL_KEYS}
            for r in landed:
                nixl["transfer_duration"].append(0.12)
                nixl["post_duration"].append(0.0004)
                nixl["bytes_transferred"].append(r.prompt_len * HOST_BYTES_PER_TOKEN)
                nixl["num_descriptors"].append(math.ceil(r.prompt_len / self.sc.block_size))
            out["NixlConnector"] = nixl
        his: dict[str, list[Any]] = {k: [] for k in HISPARSE_KEYS}
        his["host_cache_usage_perc"].append(self.host_usage())
        # write-backs and restores not yet done: the prompts still landing in host pages
        his["pending_page_transfers"].append(len(self.waiting) if self.role == "decode" else 0)
        if self.step_counter % HISPARSE_METRICS_INTERVAL == 0 and self.running:
            misses = 4 * len(self.running)
            his["cache_hits"].append(2048 * len(self.running) * HISPARSE_METRICS_INTERVAL - misses)
            his["cache_misses"].append(misses)
            his["host_to_device_bytes"].append(misses * HOST_BYTES_PER_TOKEN)
        out["HiSparseConnector"] = his
        return out

    def step(self) -> tuple[list[SimRequest], int]:
        """One engine step. Returns (requests that left this engine, tokens computed)."""
        sc = self.sc
        self.step_counter += 1
        out: list[SimRequest] = []
        prompt = gen = 0
        landed: list[SimRequest] = []
        computed_now: dict[str, int] = {}
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
                computed_now[r.request_id] = n
            for r in [r for r in self.running if r.computed >= r.prompt_len]:
                self.running.remove(r)
                r.output = 1  # the first token comes from the prefill engine
                out.append(r)
        else:
            for r in [r for r in self.waiting if r.ready_at_step <= self.step_counter]:
                self.waiting.remove(r)
                r.status = "running"
                self.running.append(r)
                landed.append(r)
            for r in self.running:
                r.output += 1
                gen += 1
                computed_now[r.request_id] = 1
            for r in [r for r in self.running if r.output >= r.max_tokens]:
                self.running.remove(r)
                r.status = "finished"
                out.append(r)
        self.last_mirrors = {r.request_id: self.row_mirrors(r, computed_now.get(r.request_id, 0)) for r in self.running}
        self._record(prompt, gen, out, landed)
        return out, prompt + gen

    def _record(self, prompt: int, gen: int, finished: list[SimRequest], landed: list[SimRequest]) -> None:
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
            for r in finished:
                m.e2e.observe(self.sc.osl * 0.025 + 4.0)
                m.server.finished(1, prompt_len=r.prompt_len, output_len=r.output, max_tokens=r.max_tokens, step_s=0.025)
        elif finished:
            for _ in finished:
                m.ttft.observe(4.0)
        p, g, since = self._window_tokens
        self._window_tokens = (p + prompt, g + gen, since)
        mirrors = self.last_mirrors
        running = self.running
        self.last_connector_stats = kvc = self.connector_stats(landed)
        his = kvc["HiSparseConnector"]
        m.host_cache.set(his["host_cache_usage_perc"][-1])
        m.pending_pages.set(his["pending_page_transfers"][-1])
        for key, counter in (("cache_hits", m.hisparse_hits), ("cache_misses", m.hisparse_misses), ("host_to_device_bytes", m.hisparse_h2d_bytes)):
            for v in his[key]:
                counter.inc(v)
        for d, b, nd in zip(
            *(kvc.get("NixlConnector", {}).get(k, []) for k in ("transfer_duration", "bytes_transferred", "num_descriptors")), strict=True
        ):
            m.nixl_xfer_time.observe(d)
            m.nixl_bytes.observe(b)
            m.nixl_descriptors.observe(nd)
        fetching = len(self.waiting) if self.role == "decode" else 0
        if m.kv_fetch_in_progress is not None:
            m.kv_fetch_in_progress.set(fetching)
        rec = StepRecord(
            engine=self.name,
            ts=now,
            step=self.step_counter,
            running=len(self.running),
            waiting=len(self.waiting),
            kv_cache_usage=usage,
            preemptions=0,
            prompt_tokens=prompt,
            generation_tokens=gen,
            finished=len(finished),
            waiting_by_reason={"capacity": len(self.waiting) - fetching, "deferred": 0, **({"kv_fetch_in_progress": fetching} if fetching else {})},
            connector=connector_record(kvc),
        )
        self.stats_ring.append(encode_step(rec))
        self.sched.write_requests(
            self.step_counter,
            ts=now,
            n=len(running),
            ids=[r.request_id for r in running],
            prompt_len=[r.prompt_len for r in running],
            computed=[r.context_len - 1 if self.role == "decode" else r.computed for r in running],
            output=[r.output for r in running],
            preemptions=[r.preemptions for r in running],
            status=[status_code(r.status) for r in running],
            mirror_rows=[sum(x.num_rows for x in mirrors.get(r.request_id, ())) for r in running],
            host_blocks=[self.host_blocks(r) for r in running],
        )

    # -- workload (the recorder's ``W`` records, as the scheduler writes them) -----------------
    def workload_arrive(self, r: SimRequest, *, max_tokens: int, ts: float | None = None) -> None:
        self.sched.write_arrival(
            r.request_id, ts=ts or time.time(), prompt_len=r.prompt_len, max_tokens=max_tokens, n=1, ignore_eos=True, has_stop=False
        )

    def workload_end(self, r: SimRequest, *, output_len: int, finish: str = "length") -> None:
        # no prefix-cache hits: the incident's prompts did not repeat
        self.sched.write_end(r.request_id, ts=time.time(), output_len=output_len, finish=finish, cached_tokens=0)

    def dump_step(self) -> vllm_logs.DumpStep:
        """The last step as vLLM's crash dump prints it (``collector.sim.vllm_logs``)."""
        running = self.running
        return vllm_logs.DumpStep(
            step=self.step_counter,
            req_ids=[r.request_id for r in running],
            num_computed_tokens=[r.context_len - 1 if self.role == "decode" else r.computed for r in running],
            num_output_tokens=[r.output for r in running],
            row_mirrors={rid: m for rid, m in self.last_mirrors.items() if m},
            waiting=len(self.waiting),
            kv_cache_usage=self.kv_usage(),
            kv_connector_stats=self.last_connector_stats or None,
            scheduler_clock=round(time.monotonic(), 6),
        )

    def close(self) -> None:
        self.stats_ring.close()
        self.sched.close()
        with contextlib.suppress(Exception):
            self.log.close()
