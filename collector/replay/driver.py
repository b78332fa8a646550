"""Drive an OpenAI-compatible ``/v1/completions`` endpoint with a plan's load.

Each request is sent at its recorded arrival offset (divided by ``speed``), but never while its
phase's concurrency level is already in flight, and a phase that waited for the one before in
the original waits here too. On a target as fast as the original that is the original's
timing; on a slower one it is what the original's closed-loop client would have done: the same
levels, held longer. In a closed-loop phase (``PlanPhase.closed_loop``) only the first
``concurrency`` requests wait for their offsets; each later one goes as soon as a slot is free,
so a faster target holds the level too instead of finishing a request before the next one's
offset. Prompts are token ids (``collector.replay.prompts``), so the target needs
no tokenizer and the lengths are exact.

A failed request (HTTP 5xx, a dropped connection) makes the driver ask the target's
``/health`` (again for a few seconds: a server fails its requests a moment before its /health
goes); when that fails too (or, for a target without ``/health``, when the connection is
refused) the engine has died: nothing more is sent, what is in flight is given a few seconds to
fail, and the result says where in the load it happened. ``stop`` (Ctrl-C) ends it the same
way, without calling it a death.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from collector.replay.plan import Plan, PlannedRequest
from collector.replay.prompts import PromptFactory

DRAIN_S = 10.0  # after a death or a stop, how long in-flight requests get to finish or fail
HEALTH_TIMEOUT_S = 3.0
# A server fails its requests a moment before its /health goes: vLLM's API server answers
# EngineDeadError while it is still up, and stops serving after. /health is asked again over
# this long before a failure is taken for one the engine survived.
DEATH_CONFIRM_S = 3.0
DEATH_CONFIRM_EVERY_S = 0.25
MAX_ERRORS_KEPT = 5


@dataclass(slots=True)
class PhaseResult:
    number: int
    concurrency: int
    planned: int
    sent: int = 0
    done: int = 0
    failed: int = 0
    first_sent: float | None = None  # seconds since the replay began
    last_done: float | None = None

    @property
    def not_sent(self) -> int:
        return self.planned - self.sent

    @property
    def in_flight(self) -> int:
        return self.sent - self.done - self.failed

    @property
    def seconds(self) -> float | None:
        if self.first_sent is None or self.last_done is None:
            return None
        return max(self.last_done - self.first_sent, 0.0)


@dataclass(slots=True)
class ReplayResult:
    phases: list[PhaseResult]
    started_at: float  # unix seconds
    elapsed: float = 0.0
    died: bool = False
    died_at: float | None = None  # seconds since the replay began
    died_phase: int | None = None  # phase number
    done_before_death: int | None = None  # requests done in that phase when it died
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)  # the first few distinct failures
    output_tokens: int = 0

    @property
    def done(self) -> int:
        return sum(p.done for p in self.phases)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.phases)

    @property
    def current(self) -> PhaseResult | None:
        started = [p for p in self.phases if p.sent]
        return started[-1] if started else None


class Driver:
    def __init__(
        self,
        plan: Plan,
        *,
        target: str,
        model: str,
        speed: float = 1.0,
        seed: int | None = None,
        token_range: tuple[int, int] | None = None,
        client: httpx.AsyncClient | None = None,
        request_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.plan, self.target, self.model, self.speed = plan, target.rstrip("/"), model, speed
        low, high = token_range or (10, 1000)
        self.prompts = PromptFactory(plan, seed=int(time.time()) if seed is None else seed, low=low, high=high)
        peak = max((p.concurrency for p in plan.phases), default=1)
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout, connect=10.0),
            limits=httpx.Limits(max_connections=peak + 4, max_keepalive_connections=peak + 4),
        )
        self.clock = clock
        self.stop = asyncio.Event()
        self.result = ReplayResult(
            phases=[PhaseResult(p.number, p.concurrency, len(p.requests)) for p in plan.phases],
            started_at=time.time(),
        )
        self._dead = asyncio.Event()
        self._changed = asyncio.Event()
        self._in_flight = 0
        self._t0 = 0.0
        self._has_health = False

    def now(self) -> float:
        return self.clock() - self._t0

    async def run(self) -> ReplayResult:
        self._t0 = self.clock()
        self.result.started_at = time.time()
        self._has_health = await self._healthy()
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._dispatch(tasks)
            pending = [t for t in tasks if not t.done()]
            if pending and not self._halted():
                await self._wait_or_halt(asyncio.gather(*pending, return_exceptions=True))
            pending = [t for t in tasks if not t.done()]
            if pending:  # dead or stopped: give in-flight requests a moment to fail by themselves
                await asyncio.wait(pending, timeout=DRAIN_S)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._own_client:
                await self.client.aclose()
        for ph in self.result.phases:  # cancelled in flight: failed, as a client would see them
            if ph.in_flight:
                ph.failed += ph.in_flight
        self.result.elapsed = self.now()
        self.result.interrupted = self.stop.is_set() and not self.result.died
        return self.result

    def _halted(self) -> bool:
        return self._dead.is_set() or self.stop.is_set()

    async def _wait_or_halt(self, aw: Any) -> None:
        """Await ``aw`` unless the engine dies or a stop is asked first."""
        task = asyncio.ensure_future(aw)
        halt = asyncio.ensure_future(self._halt_signal())
        try:
            await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halt.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, halt, return_exceptions=True)

    async def _halt_signal(self) -> None:
        while not self._halted():
            self._changed.clear()
            await self._changed.wait()

    def _signal(self) -> None:
        self._changed.set()

    async def _dispatch(self, tasks: list[asyncio.Task[None]]) -> None:
        watch = asyncio.ensure_future(self._relay_stop())
        try:
            for phase, res in zip(self.plan.phases, self.result.phases, strict=True):
                if phase.barrier:
                    await self._until(lambda: self._in_flight == 0)
                for k, req in enumerate(phase.requests):
                    paced = phase.closed_loop and k >= phase.concurrency
                    delay = 0.0 if paced else req.offset / self.speed - self.now()
                    if delay > 0:
                        await self._sleep(delay)
                    await self._until(lambda lvl=phase.concurrency: self._in_flight < lvl)  # type: ignore[misc]
                    if self._halted():
                        return
                    self._in_flight += 1
                    res.sent += 1
                    if res.first_sent is None:
                        res.first_sent = self.now()
                    tasks.append(asyncio.create_task(self._send(req, res)))
        finally:
            watch.cancel()

    async def _relay_stop(self) -> None:
        await self.stop.wait()
        self._signal()

    async def _sleep(self, seconds: float) -> None:
        await self._wait_or_halt(asyncio.sleep(seconds))

    async def _until(self, ok: Callable[[], bool]) -> None:
        while not ok() and not self._halted():
            self._changed.clear()
            await self._changed.wait()

    def body(self, req: PlannedRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": self.prompts.prompt(req), "stream": False}
        if req.max_tokens is not None:
            body["max_tokens"] = req.max_tokens
        if req.n is not None and req.n != 1:
            body["n"] = req.n
        if req.ignore_eos is not None:
            body["ignore_eos"] = req.ignore_eos  # vLLM's extension of the OpenAI API
        return body

    async def _send(self, req: PlannedRequest, res: PhaseResult) -> None:
        ok, error, fatal = False, "", False
        try:
            resp = await self.client.post(f"{self.target}/v1/completions", json=self.body(req))
            if resp.status_code == 200:
                ok = True
                usage = _usage(resp)
                if usage is not None:
                    self.result.output_tokens += usage
            else:
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                fatal = resp.status_code >= 500
        except httpx.TransportError as exc:
            error = f"{exc.__class__.__name__}: {exc}"[:240]
            fatal = True
            if not self._has_health and isinstance(exc, httpx.ConnectError):
                self._died(res)
        finally:
            self._in_flight -= 1
            if ok:
                res.done += 1
            else:
                res.failed += 1
                if error and error not in self.result.errors and len(self.result.errors) < MAX_ERRORS_KEPT:
                    self.result.errors.append(error)
            res.last_done = self.now()
            self._signal()
        if fatal and self._has_health and not self._dead.is_set() and not await self._survived():
            self._died(res)

    def _died(self, res: PhaseResult) -> None:
        if self._dead.is_set():
            return
        r = self.result
        r.died, r.died_at, r.died_phase, r.done_before_death = True, self.now(), res.number, res.done
        self._dead.set()
        self._signal()

    async def _survived(self) -> bool:
        """After a fatal failure: whether /health still answers, asked until ``DEATH_CONFIRM_S``."""
        deadline = self.clock() + DEATH_CONFIRM_S
        while True:
            if not await self._healthy():
                return False
            if self._dead.is_set() or self.clock() >= deadline:
                return not self._dead.is_set()
            await asyncio.sleep(DEATH_CONFIRM_EVERY_S)

    async def _healthy(self) -> bool:
        try:
            resp = await self.client.get(f"{self.target}/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


def _usage(resp: httpx.Response) -> int | None:
    try:
        value = resp.json().get("usage", {}).get("completion_tokens")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


async def target_model(client: httpx.AsyncClient, target: str) -> str | None:
    """The first model the target serves (``GET /v1/models``), or None."""
    try:
        resp = await client.get(f"{target.rstrip('/')}/v1/models", timeout=10.0)
        data = resp.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(data[0]["id"]) if data and isinstance(data[0], dict) and "id" in data[0] else None
