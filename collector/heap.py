"""Internal: The interpreter's cycle collector, set for a long-running sidecar.

CPython runs a collection of its youngest objects every 700 allocations that outlive their
first moment, and every so often a full one that walks every object the process holds. Most of
the sidecar's objects are made by its start and live as long as it does: the imported modules,
their functions and classes, the API's routes and models (about 120,000 objects, 45-60 ms of
CPU a full pass here). At a node's load (8 engines x 256 running x 100 steps/s: BENCHMARKS.md,
Node scale) the collector took 1.0 s of CPU in 65 s (young passes 0.23 s, middle 0.16 s, a full
pass every 10-15 s 0.62 s), 1.5% of a core and a sixth of the sidecar's CPU, and each full pass
held the event loop for about 0.1 s. With these settings it took 0.04 s in the same 65 s:

- ``freeze_startup``: once the service has started, what its start made is moved out of the
  collector's reach (``gc.freeze``); it is still freed when nothing refers to it any more, only
  never walked in search of cycles;
- ``tune``: a young collection every ``YOUNG`` allocations instead of every 700 (the records a
  poll makes either die within it, freed by their counts, or live on in the rings for minutes:
  walking them 700 at a time finds nothing to collect).

Cycles are still collected, later: the sidecar makes few (tasks, exceptions with tracebacks).
"""

from __future__ import annotations

import gc

YOUNG = 20_000
OLDER = 10  # young passes per middle one, middle passes per full one: CPython's defaults


def tune() -> None:
    gc.set_threshold(YOUNG, OLDER, OLDER)


def freeze_startup() -> None:
    """Collect once (what the start left as garbage), then keep the rest out of later passes."""
    gc.collect()
    gc.freeze()
