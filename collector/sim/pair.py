"""The simulated P/D pair: a load client, a prefill and a decode engine, a simulated kernel
log and a simulated NVML, driven in accelerated time until the decode engine dies."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.settings import EngineConfig
from collector.sim import vllm_logs
from collector.sim.engine import SimEngine
from collector.sim.nvml import FakeGpu, FakeNvmlBackend
from collector.sim.openai import CompletionsFrontend
from collector.sim.scenario import LoadClient, Scenario

log = logging.getLogger(__name__)

# The decode engine's GPU is the one of the shared H200 capture (PCI 0000:00:06).
GPU_BUSES = ("00000000:00:05.0", "00000000:00:06.0")
H200_MEMORY = 141 * 2**30  # what the sidecar's report and pages show for the simulated H200
GPU_UUIDS = ("GPU-5a1c0000-0000-4000-8000-00000000p0d0", "GPU-5a1c0000-0000-4000-8000-00000000d0d1")


@dataclass
class PairConfig:
    workdir: Path
    recorder_dir: Path
    prefill_port: int = 0
    decode_port: int = 0
    steps_per_second: float = 1500.0
    tick_s: float = 0.01
    log_every_s: float = 2.0
    scenario: Scenario = field(default_factory=Scenario)
    # no built-in load: requests come over /v1/completions (collector.sim.openai), for replay
    serve_completions: bool = False
    # a wedge instead of the crash: at the fault point the decode engine's step never ends for
    # this many seconds (its requests held, /health 200, /metrics frozen, its rings still), then
    # it moves again and the ramp goes on to its end (None: the crash, as the report's)
    hang_s: float | None = None


class SimPair:
    def __init__(self, cfg: PairConfig) -> None:
        self.cfg = cfg
        sc = cfg.scenario
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.kmsg_path = cfg.workdir / "kmsg.log"
        self.kmsg_path.write_text("")
        self.prefill = SimEngine(
            name="prefill-0",
            role="prefill",
            scenario=sc,
            port=cfg.prefill_port,
            recorder_dir=cfg.recorder_dir,
            log_path=cfg.workdir / "prefill.log",
            gpu_index=0,
            fake_pid=2911,
        )
        self.decode = SimEngine(
            name="decode-0",
            role="decode",
            scenario=sc,
            port=cfg.decode_port,
            recorder_dir=cfg.recorder_dir,
            log_path=cfg.workdir / "decode.log",
            gpu_index=1,
            fake_pid=3107,
        )
        self.client = LoadClient(sc)
        self.frontend: CompletionsFrontend | None = CompletionsFrontend(self) if cfg.serve_completions else None
        # an H200's memory from the first poll on (the fake's default is another card's)
        self.nvml = FakeNvmlBackend(
            [
                FakeGpu(uuid=u, bus_id=b, name="NVIDIA H200 (simulated)", values={"memory": (40 * 2**30, H200_MEMORY)})
                for u, b in zip(GPU_UUIDS, GPU_BUSES, strict=True)
            ]
        )
        self.crashed_at: float | None = None
        self.crash_step: int | None = None
        self.wedged_at: float | None = None  # the decode engine's last step before its wedge (hang mode)
        self.wedge_step: int | None = None
        self.resumed_at: float | None = None
        self.finished = False  # hang mode: the ramp ran to its end
        self._deferred: list[tuple[Any, float]] = []  # handed to decode while it was wedged: (request, arrival)
        self.done = asyncio.Event()
        self._extra_steps: int | None = None
        self._kmsg_seq = 1000
        self._boot = time.time() - 86400.0

    def engine_configs(self) -> list[EngineConfig]:
        return [
            EngineConfig(
                name="prefill-0", url=f"http://127.0.0.1:{self.prefill.port}", log=str(self.cfg.workdir / "prefill.log"), gpus=[0], pair="pd-0"
            ),
            EngineConfig(
                name="decode-0", url=f"http://127.0.0.1:{self.decode.port}", log=str(self.cfg.workdir / "decode.log"), gpus=[1], pair="pd-0"
            ),
        ]

    async def start(self) -> None:
        await self.prefill.start_http()
        await self.decode.start_http()

    async def run(self) -> None:
        """Drive the ramp until the decode engine has died (then keep prefill serving)."""
        cfg = self.cfg
        per_tick = max(1, round(cfg.steps_per_second * cfg.tick_s))
        last_log = time.monotonic()
        try:
            while self.crashed_at is None and not self.finished:
                t0 = time.monotonic()
                self._release()
                for _ in range(per_tick):
                    if self._one_step():
                        break
                self._gpu_values()
                if time.monotonic() - last_log >= cfg.log_every_s:
                    last_log = time.monotonic()
                    self.prefill.log_throughput()
                    self.decode.log_throughput()
                await asyncio.sleep(max(0.0, cfg.tick_s - (time.monotonic() - t0)))
            if self.crashed_at is not None:
                await self._die()
        finally:
            self.done.set()

    @property
    def wedged(self) -> bool:
        return self.wedged_at is not None and self.resumed_at is None

    def _release(self) -> None:
        """Hang mode: the wedged step ends once the hang's time has passed."""
        hang_s = self.cfg.hang_s
        if self.wedged and hang_s is not None and self.wedged_at is not None and time.time() >= self.wedged_at + hang_s:
            self.resumed_at = time.time()
            for r, arrival in self._deferred:  # its engine core adds them now (their arrival is the API server's)
                self.decode.workload_arrive(r, max_tokens=r.max_tokens, ts=arrival)
            self._deferred.clear()
            self.decode.write("EngineCore_DP0", "INFO", "core.py:420", f"step {self.wedge_step} took {self.resumed_at - self.wedged_at:.1f} s")
            log.warning("simulated decode engine moves again after %.1f s", self.resumed_at - self.wedged_at)

    def _one_step(self) -> bool:
        sc = self.cfg.scenario
        for r in self.client.to_send() if self.frontend is None else ():
            self.prefill.workload_arrive(r, max_tokens=1)  # a P/D proxy asks prefill for one token
            self.prefill.waiting.append(r)
        if self.prefill.waiting or self.prefill.running:
            moved, _ = self.prefill.step()
            for r in moved:
                self.prefill.workload_end(r, output_len=1)
                if self.wedged:  # its engine core takes new requests between steps: after the wedge
                    self._deferred.append((r, time.time()))
                else:
                    self.decode.workload_arrive(r, max_tokens=r.max_tokens)
                r.ready_at_step = self.decode.step_counter + sc.transfer_steps
                r.status = "waiting"
                self.decode.waiting.append(r)
        if self.wedged:
            # the decode engine's step never ends: it records nothing, its counters and gauges
            # stand still, /health answers 200; its API server still accepts what prefill hands over
            return self.cfg.hang_s is not None and self.client.phase is None
        if self.decode.waiting or self.decode.running:
            finished, _ = self.decode.step()
            for r in finished:
                self.decode.workload_end(r, output_len=r.output)
            if finished and self.frontend is not None:
                self.frontend.finished(finished)
            elif finished:
                self.client.finished(len(finished))
        if self.wedged_at is None and self._at_fault_point():
            self._extra_steps = (self._extra_steps or 0) + 1
            if self._extra_steps >= sc.crash_extra_steps:
                if self.cfg.hang_s is not None:  # the next step of decode never ends
                    self.wedged_at = time.time()
                    self.wedge_step = self.decode.step_counter
                    log.warning("simulated decode engine wedged after step %s", self.wedge_step)
                    return True
                self.crashed_at = time.time()
                self.crash_step = self.decode.step_counter
                return True
        if self.frontend is None and self.client.phase is None:
            self.finished = self.cfg.hang_s is not None  # hang mode: the ramp ran to its end
            return True
        return False

    def _at_fault_point(self) -> bool:
        sc = self.cfg.scenario
        if self.frontend is not None:  # replayed load: the same load point, reached by any client
            return self.frontend.at_fault_point()
        return self.client.phase_index == sc.crash_phase and self.client.done_in_phase >= sc.crash_after_done

    def _gpu_values(self) -> None:
        for gpu, eng in zip(self.nvml.gpus, (self.prefill, self.decode), strict=True):
            busy = 1.0 if eng.running else 0.0
            load = min(1.0, len(eng.running) / 16)
            gpu.values.update(
                utilization=(round(20 + 75 * busy * (0.6 + 0.4 * load), 1), round(10 + 50 * load, 1)),
                memory=(int((40 + 90 * load) * 2**30), H200_MEMORY),
                temperature=round(38 + 30 * load, 1),
                power_w=round(120 + 480 * busy * (0.5 + 0.5 * load), 1),
                compute_processes=[(eng.pids["Worker_TP0"], int((40 + 90 * load) * 2**30))],  # NVML's (pid, bytes)
            )

    async def _die(self) -> None:
        """The fault, as a real one shows: the Xid first (kernel log and NVML, ~40 ms after the
        launch), the workers' CUDA errors ~0.4 s later, then the engine core's crash dump and
        fatal error, EngineDeadError in the API server, and /metrics and /health gone."""
        sc = self.cfg.scenario
        d = self.decode
        await asyncio.sleep(0.04)
        self._kmsg_seq += 1
        usec = int((time.time() - self._boot) * 1e6)
        with open(self.kmsg_path, "a") as f:
            f.write(vllm_logs.kmsg_xid(self._kmsg_seq, usec, "0000:00:06", sc.xid, d.pids["Worker_TP0"]) + "\n")
        self.nvml.push_xid(1, sc.xid)
        await asyncio.sleep(0.4)
        ts = time.time()
        d.write_lines(vllm_logs.worker_failure("Worker_TP0", d.pids["Worker_TP0"], ts, vllm_logs.TRACEBACK_TP0))
        d.write_lines(vllm_logs.worker_failure("Worker_TP1", d.pids["Worker_TP1"], ts, vllm_logs.TRACEBACK_TP1))
        d.write_lines(vllm_logs.crash_dump(d.pids["EngineCore_DP0"], ts, d.dump_step(), sc.model, "0.11.1"))
        done, failed = self.client.fail_rest() if self.frontend is None else self.frontend.fail_all()
        # the proxy fails them on prefill too: its engine aborts what it held, and its last step
        # says it holds nothing (idle from here, not stopped with requests held: that is a wedge)
        p = self.prefill
        for r in [*p.running, *p.waiting]:
            p.workload_end(r, output_len=0, finish="abort")
        p.running.clear()
        p.waiting.clear()
        p.step()
        await asyncio.sleep(0.05)
        d.write_lines(vllm_logs.api_server_death(d.pids["APIServer"], time.time()))
        d.write("APIServer", "INFO", "api_server.py:1990", f"C{sc.phases[sc.crash_phase].concurrency} phase: {done} done / {failed} failed")
        d.alive = False
        await d.stop_http()
        log.warning("simulated decode engine died at step %s", self.crash_step)

    def status(self) -> dict[str, Any]:
        return {
            "wedged_at": self.wedged_at,
            "resumed_at": self.resumed_at,
            "decode_step": self.decode.step_counter,
            "prefill_step": self.prefill.step_counter,
            "phase": self.client.phase_index,
            "done": self.client.done_total,
        }

    async def close(self) -> None:
        await self.prefill.stop_http()
        await self.decode.stop_http()
        self.prefill.close()
        self.decode.close()
