"""The incident's load and fault, as data (pure: no I/O, no clock).

The ramp of the report: concurrency 1 -> 2 -> 4 -> 8 -> 16, ISL 32000, OSL 2000. About 40
requests complete before the C16 phase; in C16 the decode engine dies after 10 requests are
done, failing the other 22 (16 running, 6 not yet admitted).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Phase:
    concurrency: int
    requests: int


@dataclass(frozen=True)
class Scenario:
    phases: tuple[Phase, ...] = (Phase(1, 4), Phase(2, 6), Phase(4, 12), Phase(8, 16), Phase(16, 32))
    isl: int = 32000
    osl: int = 2000
    block_size: int = 64
    prefill_chunk: int = 8192  # tokens per prefill step (chunked prefill budget)
    transfer_steps: int = 2  # decode steps a KV transfer takes to land
    device_window_tokens: int = 2048  # sparse attention: tokens per request kept on device
    # At the fault 15 requests run on decode (the 16th is still in prefill): 15 x 2048 tokens of
    # 960k is the report's kv_cache_usage of 0.032.
    decode_kv_capacity_tokens: int = 960_000
    prefill_kv_capacity_tokens: int = 1_048_576
    crash_phase: int = 4  # index into phases (C16)
    crash_after_done: int = 10  # requests done in the crash phase before the fault
    crash_extra_steps: int = 2  # steps after the 10th completion: the 11th is still running
    host_pool_gib: float = 128.0  # the HiSparse connector's host_pool_gib
    device_buffer_size: int | None = None  # hisparse_config: None is vLLM's default (2 top-k)
    eager_host_mirror: bool = True  # hisparse_config: vLLM's default
    device_rows_per_request: int = 4096  # that default for DeepSeek-V3.2 (top-k 2048)
    # The incident's PR stack ran FULL graphs with HiSparse; released vLLM refuses FULL with
    # HiSparse (real deployments run FULL_AND_PIECEWISE or FULL_DECODE_ONLY).
    cudagraph_mode: str = "FULL"
    failing_workers: tuple[str, ...] = ("Worker_TP0", "Worker_TP1")
    xid: int = 43  # a `trap` fault gives Xid 43 on a real H200 (gpu-facts)
    model: str = "deepseek-ai/DeepSeek-V3.2-Exp"
    tp: int = 2

    @property
    def host_pool_bytes(self) -> int:
        return int(self.host_pool_gib * 2**30)


def request_id(n: int) -> str:
    """vLLM's id of the n-th completion request: ``cmpl-<32 hex>-0`` (a random uuid in vLLM,
    derived from ``n`` here so a run is reproducible)."""
    return f"cmpl-{hashlib.md5(f'sim-request-{n}'.encode()).hexdigest()}-0"


@dataclass
class SimRequest:
    request_id: str
    prompt_len: int
    max_tokens: int
    computed: int = 0  # prompt tokens computed (prefill) or context held (decode)
    output: int = 0
    preemptions: int = 0
    status: str = "waiting"
    ready_at_step: int = 0

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.output


@dataclass
class LoadClient:
    """Keeps ``concurrency`` requests in flight per phase, like the report's benchmark client."""

    scenario: Scenario
    phase_index: int = 0
    sent_in_phase: int = 0
    done_in_phase: int = 0
    done_total: int = 0
    in_flight: int = 0
    next_id: int = 0
    history: list[tuple[int, int, int]] = field(default_factory=list)  # (phase C, done, failed)

    @property
    def phase(self) -> Phase | None:
        if self.phase_index >= len(self.scenario.phases):
            return None
        return self.scenario.phases[self.phase_index]

    def to_send(self) -> list[SimRequest]:
        out = []
        phase = self.phase
        while phase and self.in_flight < phase.concurrency and self.sent_in_phase < phase.requests:
            self.next_id += 1
            self.sent_in_phase += 1
            self.in_flight += 1
            out.append(SimRequest(request_id(self.next_id), self.scenario.isl, self.scenario.osl))
        return out

    def finished(self, n: int = 1) -> None:
        self.in_flight -= n
        self.done_in_phase += n
        self.done_total += n
        phase = self.phase
        if phase and self.done_in_phase >= phase.requests:
            self.history.append((phase.concurrency, self.done_in_phase, 0))
            self.phase_index += 1
            self.sent_in_phase = self.done_in_phase = 0

    def fail_rest(self) -> tuple[int, int]:
        """The engine died: everything in flight or unsent in this phase fails."""
        phase = self.phase
        if phase is None:
            return 0, 0
        failed = self.in_flight + (phase.requests - self.sent_in_phase)
        self.history.append((phase.concurrency, self.done_in_phase, failed))
        return self.done_in_phase, failed
