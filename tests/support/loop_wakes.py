"""How often an event loop went to sleep: a selector that counts its waits (tests/test_ticks.py,
bench/bench_wakes.py)."""

from __future__ import annotations

import selectors


class CountingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:
            self.waits += 1
        return super().select(timeout)
