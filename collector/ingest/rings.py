"""The flight recorder's memory: bounded rings of the last steps, GPU samples and log lines.

``EngineRing`` keeps the last ``max_steps`` steps of one engine. A step can arrive in two
halves from two processes (the stat logger's SchedulerStats and the scheduler's per-request
rows), so records with the same step number are merged, whichever comes first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

from collector.model import GpuSample, LogLine, StepRecord

_STAT_FIELDS = (
    "ts", "running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens",
    "generation_tokens", "finished", "waiting_by_reason", "prefix_cache_queries",
    "prefix_cache_hits", "connector", "engine_index", "worker", "finished_requests",
)  # fmt: skip


class EngineRing:
    def __init__(self, max_steps: int) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.max_steps = max_steps
        self._steps: OrderedDict[int, StepRecord] = OrderedDict()
        self._has_stats: set[int] = set()
        self.received = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, rec: StepRecord) -> StepRecord:
        """Insert or merge; returns the record now held for that step."""
        self.received += 1
        held = self._steps.get(rec.step)
        is_stats = rec.requests is None
        if held is None:
            self._steps[rec.step] = rec
            if is_stats:
                self._has_stats.add(rec.step)
            if len(self._steps) > self.max_steps:
                old, _ = self._steps.popitem(last=False)
                self._has_stats.discard(old)
                self.evicted += 1
            return rec
        if is_stats:
            for name in _STAT_FIELDS:
                setattr(held, name, getattr(rec, name))
            self._has_stats.add(rec.step)
        else:
            held.requests = rec.requests
            held.request_columns = rec.request_columns
            if rec.step not in self._has_stats:
                held.running = rec.running
        return held

    def steps(self) -> list[StepRecord]:
        """The held steps in step order (arrival order is step order per writer)."""
        return sorted(self._steps.values(), key=lambda r: r.step)

    def last(self) -> StepRecord | None:
        if not self._steps:
            return None
        return max(self._steps.values(), key=lambda r: r.step)

    def get(self, step: int) -> StepRecord | None:
        return self._steps.get(step)


class TimeRing:
    """Samples of the last ``seconds`` (by their own timestamps), at most ``max_items``."""

    def __init__(self, seconds: float, max_items: int = 100_000) -> None:
        self.seconds = seconds
        self._items: deque[GpuSample] = deque(maxlen=max_items)

    def add(self, item: GpuSample) -> None:
        self._items.append(item)
        horizon = item.ts - self.seconds
        while self._items and self._items[0].ts < horizon:
            self._items.popleft()

    def since(self, ts: float) -> list[GpuSample]:
        return [s for s in self._items if s.ts >= ts]

    def last(self) -> GpuSample | None:
        return self._items[-1] if self._items else None

    def __len__(self) -> int:
        return len(self._items)


class LineRing:
    def __init__(self, max_lines: int) -> None:
        self._lines: deque[LogLine] = deque(maxlen=max_lines)

    def add(self, line: LogLine) -> None:
        self._lines.append(line)

    def extend(self, lines: Iterable[LogLine]) -> None:
        self._lines.extend(lines)

    def all(self) -> list[LogLine]:
        return list(self._lines)
