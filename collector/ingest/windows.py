"""The flight recorder's memory: bounded windows of the last GPU samples and log lines (an
engine's steps: ``collector.ingest.window``).

"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from collector.model import GpuSample, LogLine


class TimeWindow:
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


class LineWindow:
    def __init__(self, max_lines: int) -> None:
        self._lines: deque[LogLine] = deque(maxlen=max_lines)

    def add(self, line: LogLine) -> None:
        self._lines.append(line)

    def extend(self, lines: Iterable[LogLine]) -> None:
        self._lines.extend(lines)

    def all(self) -> list[LogLine]:
        return list(self._lines)
