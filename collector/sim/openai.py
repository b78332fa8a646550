"""An OpenAI-compatible front for the simulated pair, so that ``flightrec replay`` can drive it.

``POST /v1/completions`` and ``GET /v1/models`` on the decode engine's port, like the P/D
proxy of the incident's deployment: a request goes to the prefill engine, then to the decode
engine, and is answered when decode has generated ``max_tokens`` tokens (the simulated engines
always run to ``max_tokens``, as ``ignore_eos`` does). Prompts are token ids, or text counted
one token per word.

The fault fires at the scenario's load point, not at a step number: once as many requests as
the crash phase's concurrency (16) are in flight, after ``crash_after_done`` (10) of them have
completed (then ``crash_extra_steps`` more steps). A load that never reaches C16 never kills
the engine; a replay of the incident's ramp does, in its C16 phase.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from collector.sim.scenario import SimRequest

if TYPE_CHECKING:
    from collector.sim.pair import SimPair

DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class CompletionsFrontend:
    def __init__(self, pair: SimPair) -> None:
        self.pair = pair
        sc = pair.cfg.scenario
        self.level = sc.phases[sc.crash_phase].concurrency
        self.after_done = sc.crash_after_done
        self.pending: dict[str, tuple[SimRequest, asyncio.Future[SimRequest]]] = {}
        self.level_reached = False
        self.done_at_level = 0
        self.done = 0
        self._next = 0
        pair.decode.routes.append(self.install)

    # -- the fault rule ----------------------------------------------------------------------
    def at_fault_point(self) -> bool:
        return self.level_reached and self.done_at_level >= self.after_done

    def finished(self, reqs: list[SimRequest]) -> None:
        for r in reqs:
            item = self.pending.pop(r.request_id, None)
            if item is not None and not item[1].done():
                item[1].set_result(r)
            self.done += 1
            if self.level_reached:
                self.done_at_level += 1

    def fail_all(self) -> tuple[int, int]:
        """The engine died: every request in flight fails. Returns (done, failed) since the
        crash level was reached, the figures of the C16 line in the engine log."""
        failed = 0
        for _, fut in self.pending.values():
            if not fut.done():
                fut.set_exception(RuntimeError(DEAD_MESSAGE))
                failed += 1
        self.pending.clear()
        return self.done_at_level, failed

    # -- HTTP --------------------------------------------------------------------------------
    def submit(self, prompt_len: int, max_tokens: int) -> asyncio.Future[SimRequest]:
        self._next += 1
        r = SimRequest(f"cmpl-sim-{self._next:06d}-0", prompt_len, max_tokens)
        fut: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
        self.pending[r.request_id] = (r, fut)
        if len(self.pending) >= self.level:
            self.level_reached = True
        self.pair.prefill.workload_arrive(r, max_tokens=1)  # the proxy asks prefill for one token
        self.pair.prefill.waiting.append(r)
        return fut

    def install(self, app: FastAPI) -> None:
        model = self.pair.cfg.scenario.model

        @app.get("/v1/models")
        def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]}

        @app.post("/v1/completions")
        async def completions(body: dict[str, Any] = Body(...)) -> JSONResponse:  # noqa: B008 - FastAPI's idiom
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_len = len(prompt)
            elif isinstance(prompt, str) and prompt:
                prompt_len = len(prompt.split())
            else:
                return _error(400, "prompt must be a non-empty string or list of token ids", "BadRequestError")
            max_tokens = body.get("max_tokens", 16)
            if not isinstance(max_tokens, int) or max_tokens < 1:
                return _error(400, "max_tokens must be a positive integer", "BadRequestError")
            if not self.pair.decode.alive:
                return _error(500, DEAD_MESSAGE, "InternalServerError")
            try:
                r = await self.submit(prompt_len, max_tokens)
            except RuntimeError as exc:
                return _error(500, str(exc), "InternalServerError")
            return JSONResponse(
                {
                    "id": r.request_id,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": prompt_len, "completion_tokens": r.output, "total_tokens": prompt_len + r.output},
                }
            )


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)
