"""Prompts for a replay: token ids of the recorded lengths, fresh unless the plan says reuse.

A prompt's content never leaves the engine that served it (the workload log keeps lengths
only), and it would not help: what breaks an engine is the shape of the load. What matters of
the content is whether two prompts share a prefix, because that decides prefix-cache hits and
so how much work each request costs. Every prompt here therefore starts (after any prefix the
plan asks it to reuse) with a marker that no other prompt of the run carries: the run's nonce
and the request's index, written as digits over the token range. Two prompts then differ in
their first non-reused block, whatever the random tokens after the marker are.

Token ids are drawn from ``[low, high)``: ids below 10 are special tokens (BOS, EOS, padding)
in the common vocabularies, and 1,000 fits every model's vocabulary, the test's tiny Llama's
(1,024) included.
"""

from __future__ import annotations

import random

from collector.replay.plan import Plan, PlannedRequest

DEFAULT_LOW = 10
DEFAULT_HIGH = 1000
MARKER_DIGITS = 4  # the request index: 990^4 = 960 billion requests


class PromptFactory:
    def __init__(self, plan: Plan, *, seed: int, low: int = DEFAULT_LOW, high: int = DEFAULT_HIGH) -> None:
        if high - low < 2:
            raise ValueError("the token range needs at least two ids")
        self.low, self.high = low, high
        self._rng = random.Random(seed)
        self._nonce = [self._rng.randrange(low, high) for _ in range(2)]
        self._seed = seed
        # keep, of each prompt that a later one reuses, only the prefix that is reused
        self._keep: dict[int, int] = {}
        self._last_user: dict[int, int] = {}  # a kept prefix is dropped once its last user is built
        for r in plan.requests:
            if r.prefix_of is not None:
                self._keep[r.prefix_of] = max(self._keep.get(r.prefix_of, 0), r.prefix_len)
                self._last_user[r.prefix_of] = max(self._last_user.get(r.prefix_of, -1), r.index)
        self._kept: dict[int, list[int]] = {}

    def marker(self, index: int) -> list[int]:
        base = self.high - self.low
        digits = []
        for _ in range(MARKER_DIGITS):
            index, d = divmod(index, base)
            digits.append(self.low + d)
        return self._nonce + digits

    def prompt(self, req: PlannedRequest) -> list[int]:
        """The prompt of ``req``; call in plan order (a reused prefix must have been built)."""
        head: list[int] = []
        if req.prefix_of is not None and req.prefix_len:
            head = self._kept.get(req.prefix_of, [])[: req.prefix_len]
            if self._last_user.get(req.prefix_of) == req.index:
                self._kept.pop(req.prefix_of, None)
        rng = random.Random(self._seed * 1_000_003 + req.index)
        fresh_len = max(req.prompt_len - len(head), 0)
        fresh = self.marker(req.index)[:fresh_len]
        fresh += [rng.randrange(self.low, self.high) for _ in range(fresh_len - len(fresh))]
        out = head + fresh
        keep = self._keep.get(req.index)
        if keep:
            self._kept[req.index] = out[:keep]
        return out
