"""The CPU time a parser spends per input byte, for the poison-input tests and the fuzz slice.

Process CPU time, not wall time: the bound must hold on a loaded machine. The budget is far
above what a linear parser costs (about 2-10 us a byte here) and far below what the quadratic
cases cost (300-450 us a byte at 8-40 KB), so it tells one from the other without being a
benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Callable

US_PER_BYTE_BUDGET = 50.0


def us_per_byte(parse: Callable[[str], object], text: str, *, swallow: tuple[type[BaseException], ...] = ()) -> float:
    start = time.process_time()
    try:
        parse(text)
    except swallow:
        pass
    return (time.process_time() - start) * 1e6 / max(len(text), 1)
