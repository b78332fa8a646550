"""The sidecar's per-step ingest in process: ring read, decode, filing into the hub, the writer's
queue and its rows, for E engines x R running requests, without a clock to keep up with.

    python bench/bench_ingest.py --engines 8 --running 256 --steps 1000 --rounds 5

Each round the simulator's load model writes ``--steps`` steps into every engine's two rings (as
vLLM's two processes do), then one ``RecorderSource.poll`` files them all into a ``Hub`` whose
rows go to a ``BatchWriter`` queue; then ingest hands the writer its steps (``StepBatch``es; in
a checkout before them, the writer's rows are built from its per-record queue) and nothing is
sent anywhere. ``PYTHONPATH=../other-checkout`` measures that checkout's code. Prints CPU
microseconds per step (both halves) for the poll and for the rows, best and median of the
rounds: the node bench's 800 steps/s costs 800 x that per second.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from collector import heap
from collector.ingest.hub import hub_for
from collector.settings import Settings
from collector.sim.load import EngineLoad, LoadConfig
from collector.sources.recorder import RecorderSource
from collector.storage.writer import BatchWriter


class _NoRepo:
    """The writer's queue only: flush is never called."""


def main() -> None:
    logging.disable(logging.WARNING)  # the rings join no configured engine: said once per ring
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps", type=int, default=1000, help="steps per engine per round (a round must fit the rings)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-ingest-") as tmp:
        folder = Path(tmp)
        cfg = LoadConfig(recorder_dir=folder, engines=args.engines, running=args.running)
        t = [1_000_000.0]
        loads = [EngineLoad(cfg, i, clock=lambda: t[0]) for i in range(args.engines)]
        writer = BatchWriter(_NoRepo(), interval=1.0, clock=lambda: t[0])  # type: ignore[arg-type]
        hub = hub_for(Settings(engines=[]), rows=writer)
        # Each round is read whole: no per-poll byte, record or time budget, and no ring dropped
        # for being behind (a round is a backlog by design); a checkout without them reads all.
        whole: dict[str, Any] = {"poll_bytes": 1 << 40, "max_poll_records": 1 << 30, "poll_budget_s": 1e9, "coarse_at": 0.99, "skip_at": 1.0}
        while True:
            try:
                source = RecorderSource(folder, alive=lambda pid: True, join_wait=0.0, **whole)
                break
            except TypeError:
                if not whole:
                    raise
                whole.popitem()
        source.poll(hub)  # the meta and fingerprint records
        heap.freeze_startup()  # the collector as ``flightrec serve`` sets it
        heap.tune()
        poll_us, rows_us = [], []
        for _ in range(args.rounds):
            for _ in range(args.steps):
                t[0] += 0.01
                for load in loads:
                    load.step()
            c0 = time.process_time()
            source.poll(hub)
            c1 = time.process_time()
            release = getattr(writer, "_release", None)
            if release is not None:  # steps as column batches, handed over by ingest
                release(True)
                c2 = time.process_time()
                writer._q.batches.clear()
            else:  # a checkout with the per-record queue
                from collector.storage.writer import step_tuples  # type: ignore[attr-defined]  # noqa: PLC0415

                step_tuples([rec for _, rec in writer._q.steps.values()])  # type: ignore[attr-defined]
                c2 = time.process_time()
                writer._q.steps.clear()  # type: ignore[attr-defined]
            n = args.steps * args.engines
            poll_us.append((c1 - c0) / n * 1e6)
            rows_us.append((c2 - c1) / n * 1e6)
        for load in loads:
            load.close()
    received = sum(info.steps_received for n in hub.view.engine_names() if (info := hub.view.engine(n)) is not None)
    print(f"bench_ingest: {args.engines} engines x {args.running} running, {args.rounds} rounds of {args.steps} steps each")
    print(f"half records filed           {received:,} (expected {2 * args.engines * args.steps * args.rounds:,})")
    print(f"poll (read, decode, file)    best {min(poll_us):.1f} us/step, median {statistics.median(poll_us):.1f}")
    print(f"writer rows                   best {min(rows_us):.1f} us/step, median {statistics.median(rows_us):.1f}")
    best = min(poll_us) + min(rows_us)
    print(f"at 800 steps/s               {best * 800 / 1e4:.1f}% of a core")


if __name__ == "__main__":
    main()
