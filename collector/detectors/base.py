"""What a detector returns, and the small helpers every detector shares.

A detector is a pure function over series (no clock of its own, no I/O): given the recent
records and ``now`` it returns a ``DetectorState``. A failed check is data (state, reason,
suggested action), which the runner turns into transitions, the hub into alerts, and the API
serves as is. ``Hysteresis`` keeps a noisy raw state from flapping.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from collector.model import Severity  # a detector's state is on the events' scale (OK: nothing wrong)


@dataclass(frozen=True, slots=True)
class DetectorState:
    name: str  # detector name, e.g. "engine_stall"
    state: Severity
    reason: str = ""
    suggested_action: str = ""
    value: float | None = None  # the figure the decision was made on
    labels: dict[str, str] = field(default_factory=dict)  # engine=... or gpu=...
    ts: float = 0.0

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return self.name, tuple(sorted(self.labels.items()))

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state.value,
            "reason": self.reason,
            "suggested_action": self.suggested_action,
            "value": self.value,
            "labels": dict(self.labels),
            "ts": self.ts,
        }


@dataclass(frozen=True, slots=True)
class Transition:
    """A published state change: ``previous`` is what was published before (OK at first)."""

    previous: DetectorState
    current: DetectorState


def ok(name: str, labels: dict[str, str], ts: float, reason: str = "", value: float | None = None) -> DetectorState:
    return DetectorState(name=name, state=Severity.OK, reason=reason, value=value, labels=labels, ts=ts)


class Hysteresis:
    """Publish a raw level only once it held for enough consecutive evaluations.

    A worse level is entered after ``enter_after`` evaluations in a row at least that bad
    (the mildest of them is entered); a better level after ``exit_after`` in a row at most
    that good. Anything else resets the streak, so noise that alternates never moves it.
    """

    def __init__(self, *, enter_after: int = 2, exit_after: int = 3) -> None:
        if enter_after < 1 or exit_after < 1:
            raise ValueError("enter_after and exit_after must be at least 1")
        self.enter_after = enter_after
        self.exit_after = exit_after
        self.level = Severity.OK
        self._worse: list[Severity] = []
        self._better: list[Severity] = []

    def update(self, raw: Severity) -> Severity:
        if raw.rank > self.level.rank:
            self._better.clear()
            self._worse.append(raw)
            if len(self._worse) >= self.enter_after:
                self.level = min(self._worse[-self.enter_after :], key=lambda lv: lv.rank)
                self._worse.clear()
        elif raw.rank < self.level.rank:
            self._worse.clear()
            self._better.append(raw)
            if len(self._better) >= self.exit_after:
                self.level = max(self._better[-self.exit_after :], key=lambda lv: lv.rank)
                self._better.clear()
        else:
            self._worse.clear()
            self._better.clear()
        return self.level


T = TypeVar("T")


def since(records: Sequence[T], start: float, ts: Callable[[T], float]) -> list[T]:
    """Records with ts >= start, oldest first (in time order: a bisection of a list; other
    sequences are walked back from the newest, as rings are long)."""
    if isinstance(records, list):
        return records[bisect_left(records, start, key=ts) :]
    out: list[T] = []
    for record in reversed(records):
        if ts(record) < start:
            break
        out.append(record)
    out.reverse()
    return out


def mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return sum(items) / len(items) if items else None


def median(values: Iterable[float]) -> float | None:
    items = sorted(values)
    if not items:
        return None
    mid = len(items) // 2
    return items[mid] if len(items) % 2 else (items[mid - 1] + items[mid]) / 2
