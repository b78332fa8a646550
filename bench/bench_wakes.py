"""What the event loop's wakes cost on this machine, and what the shared ticks save.

    python bench/bench_wakes.py                # 10 s a figure
    python bench/bench_wakes.py --seconds 30 --logs 8

Prints, each as CPU of this process (utime + stime) over ``--seconds``:
- one wake of an idle asyncio loop (a task sleeping 25 ms at a time), in us;
- the sidecar's periodic tasks at node scale (the recorder's poll and uvicorn's tick every 0.1 s,
  the heartbeat and the kernel log's mark every 0.2 s, 8 engines' scrapes, the writer, the
  detectors and the wedge watch every second, the kernel log file every 0.1 s), with no work in
  them: each on its own phase (``asyncio.sleep``, started apart) against all on the shared ticks
  (``collector.ticks.sleep_to_tick``): the loop's wakes a second and the share of a core;
- ``--logs`` quiet engine logs followed (``EngineLogSource`` on files nobody writes): each
  follower's read its own worker call (``asyncio.to_thread``) against the reads of one tick in one
  call (``collector.sources.batched_reads``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.sources import engine_log  # noqa: E402
from collector.sources.engine_log import EngineLogSource  # noqa: E402
from collector.ticks import sleep_to_tick  # noqa: E402
from tests.support.loop_wakes import CountingSelector  # noqa: E402

PERIODS = [0.1, 0.1, 0.2, 0.2, 0.1] + [1.0] * 8 + [1.0, 1.0, 1.0]


def _run(main: Callable[[], Awaitable[None]], seconds: float) -> tuple[float, float]:
    """(share of a core, loop waits a second) while ``main`` runs for ``seconds``."""
    selector = CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)

    async def timed() -> tuple[float, int]:
        task = asyncio.create_task(main())
        await asyncio.sleep(1.0)  # started
        t0, w0 = time.process_time(), selector.waits
        await asyncio.sleep(seconds)
        cpu, waits = time.process_time() - t0, selector.waits - w0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return cpu, waits

    try:
        cpu, waits = loop.run_until_complete(timed())
    finally:
        loop.close()
    return cpu / seconds, waits / seconds


def _periodic(sleep: Callable[[float], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
    async def every(period: float, offset: float) -> None:
        await asyncio.sleep(offset)
        while True:
            await sleep(period)

    async def main() -> None:
        await asyncio.gather(*(every(p, 0.007 * i) for i, p in enumerate(PERIODS)))

    return main


def _logs(n: int, folder: Path) -> Callable[[], Awaitable[None]]:
    class _Sink:
        def emit(self, item: object) -> None:
            pass

    async def main() -> None:
        sources = []
        for i in range(n):
            path = folder / f"engine-{i}.log"
            path.write_text("INFO started\n")
            sources.append(EngineLogSource(f"engine-{i}", path))
        await asyncio.gather(*(s.run(_Sink()) for s in sources))

    return main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--logs", type=int, default=8)
    args = ap.parse_args()
    print(f"bench_wakes: {args.seconds:g} s a figure; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    async def idle() -> None:
        while True:
            await asyncio.sleep(0.025)

    share, waits = _run(idle, args.seconds)
    print(f"{'one wake of an idle loop':<58} {share / waits * 1e6:8.1f} us CPU ({waits:.1f} wakes/s)")
    for name, sleep in (("each on its own phase", asyncio.sleep), ("on the shared ticks", sleep_to_tick)):
        share, waits = _run(_periodic(sleep), args.seconds)
        print(f"{'the sidecar periodic tasks, ' + name:<58} {share * 100:7.2f}% of a core, {waits:5.1f} wakes/s")
    with tempfile.TemporaryDirectory() as tmp:
        real = engine_log.read_in_thread
        for name, read in (("a worker call each", asyncio.to_thread), ("one worker call a tick", real)):
            engine_log.read_in_thread = read  # type: ignore[assignment]
            try:
                share, waits = _run(_logs(args.logs, Path(tmp)), args.seconds)
            finally:
                engine_log.read_in_thread = real
            print(f"{f'{args.logs} quiet engine logs followed, ' + name:<58} {share * 100:7.2f}% of a core, {waits:5.1f} wakes/s")


if __name__ == "__main__":
    main()
