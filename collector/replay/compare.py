"""Compare a replay's recorded workload with the original's: was it the same load, and did the
fault come at the same point of it? Pure; the tolerances are module constants, stated here:

- prompt lengths: the minimum, median and maximum within ``PROMPT_TOL`` (1%) of the
  original's (token-id prompts arrive exactly as sent, so a real engine gives equality);
- max tokens: the same values in the same numbers, over the requests both logs hold (sorted,
  so that two requests sent together may reach the engine in either order);
- concurrency: the same number of requests, except in the phase of the fault, where the replay
  must hold at least the requests that completed there in the original (the ones in flight at
  a fault depend on which were still on their way: a P/D pair's decode engine does not log a
  request until its prefill is done), and each request's level (the most requests in
  flight during its life, in arrival order) within ``LEVEL_TOL`` (25%, rounded down: C1 and C2
  exact, C4 +-1, C8 +-2, C16 +-4) of the original request's at the same position, for the
  requests neither run cut short at the fault. Timing on a
  shared machine moves a request's neighbours by a few steps; it does not turn C16 into C8;
- the fault: in the phase (by the original's numbering) where the original's was, after a
  number of completions there within ``DONE_TOL`` (20%, at least 1) of the original's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.replay.plan import Plan

PROMPT_TOL = 0.01
LEVEL_TOL = 0.25
DONE_TOL = 0.20


@dataclass(slots=True)
class Comparison:
    same_prompts: bool
    same_max_tokens: bool
    same_concurrency: bool
    same_fault_point: bool | None  # None when the original did not crash
    notes: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return self.same_prompts and self.same_max_tokens and self.same_concurrency and self.same_fault_point is not False


def _quantiles(values: list[int]) -> tuple[int, int, int]:
    s = sorted(values)
    return s[0], s[len(s) // 2], s[-1]


def _phase_of(plan: Plan, position: int) -> int:
    """The original's phase number of the request at ``position`` in arrival order."""
    seen = 0
    for ph in plan.phases:
        seen += len(ph.requests)
        if position < seen:
            return ph.number
    return plan.phases[-1].number


def compare(original: Plan, replay: Plan) -> Comparison:
    a, b = original.requests, replay.requests
    notes: list[str] = []
    qa, qb = _quantiles([r.prompt_len for r in a]), _quantiles([r.prompt_len for r in b])
    same_prompts = all(abs(x - y) <= PROMPT_TOL * x for x, y in zip(qa, qb, strict=True))
    notes.append(f"prompt length min/median/max: original {qa}, replay {qb}")
    k = min(len(a), len(b))
    mt_a = sorted(r.max_tokens or 0 for r in a[:k])
    mt_b = sorted(r.max_tokens or 0 for r in b[:k])
    same_max = mt_a == mt_b
    if not same_max:
        notes.append(f"max tokens differ: original {sorted(set(mt_a))}, replay {sorted(set(mt_b))}")
    # Levels are compared for requests that lived their whole life in both runs: one cut short by
    # the fault saw a share of its phase that depends on when, to the step, the engine died.
    cut = ("failed_by_crash", "in_flight")
    off = [
        (i, x.level, y.level)
        for i, (x, y) in enumerate(zip(a, b, strict=False))
        if x.outcome not in cut and y.outcome not in cut and abs(x.level - y.level) > int(LEVEL_TOL * x.level)
    ]
    crash = original.crash_phase
    if crash is None:
        same_conc = len(a) == len(b) and not off
    else:
        before = sum(len(p.requests) for p in original.phases[: crash.number - 1])
        same_conc = before + crash.original("finished") <= len(b) <= len(a) and not off
    if len(a) != len(b):
        notes.append(f"requests: original {len(a)}, replay {len(b)}")
    if off:
        notes.append("levels off beyond tolerance at (position, original, replay): " + ", ".join(map(str, off[:8])))
    fault: bool | None = None
    if crash is not None:
        again = replay.crash_phase
        if again is None:
            fault = False
            notes.append("the replay's engine did not die")
        else:
            first_failed = next(r.index for r in again.requests if r.outcome == "failed_by_crash")
            phase = _phase_of(original, first_failed)
            done_a = crash.original("finished")
            # completions of the replay's requests that sit in the original's crash phase
            start = sum(len(p.requests) for p in original.phases[: crash.number - 1])
            done_b = sum(1 for r in b[start:] if r.outcome == "finished")
            fault = phase == crash.number and abs(done_b - done_a) <= max(1, int(DONE_TOL * done_a))
            notes.append(f"fault: original in phase {crash.number} after {done_a} done there, replay in phase {phase} after {done_b}")
    return Comparison(same_prompts, same_max, same_conc, fault, notes)
