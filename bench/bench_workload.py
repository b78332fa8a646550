"""The workload log's export at a fault: what a snapshot's capture costs on the event loop.

    .venv/bin/python bench/bench_workload.py [--requests 10000] [--runs 7] [--json FILE]
    PYTHONPATH=../other-checkout .venv/bin/python bench/bench_workload.py   # that checkout's log

A log of ``--requests`` requests (one engine, ids as vLLM's, prompt lengths, a few finish
reasons, a third still in flight) exported at the newest record's time, once not crashed and
once crashed (the crash closes the open requests first: each run gets a fresh log). Prints the
median and best in milliseconds; a node-wide fault exports 8 such logs on the loop.

The export makes a list per point of the concurrency series (~16,000 at 10,000 requests), so
the cycle collector's settings weigh on it: the figures are taken with the sidecar's
(``collector.heap.tune``, which ``flightrec serve`` applies), then for reference with
CPython's defaults (``*_default_gc_ms``).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

from collector import heap
from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd


def filled(requests: int, seed: int = 1) -> tuple[WorkloadLog, float]:
    rng = random.Random(seed)
    log = WorkloadLog(max_requests=requests)
    t = 1_765_000_000.0
    ends: list[WorkloadArrival | WorkloadEnd] = []
    batch: list[WorkloadArrival | WorkloadEnd] = []
    for i in range(requests):
        t += rng.random() * 0.02
        rid = f"cmpl-{i:08x}-0-{rng.getrandbits(32):08x}"
        batch.append(WorkloadArrival(rid, t, rng.randint(100, 32_000), 2000, 1, rng.random() < 0.5, False))
        if rng.random() < 0.66:
            ends.append(WorkloadEnd(rid, t + rng.random() * 5, rng.randint(1, 2000), rng.choice(("stopped", "length", "aborted")), 0))
        if len(batch) >= 64:  # one read of a ring: a batch of records
            log.add(WorkloadBatch(engine="decode-0", ts=t, records=batch))
            batch = []
    ends.sort(key=lambda e: e.ts)
    log.add(WorkloadBatch(engine="decode-0", ts=t, records=batch + [e for e in ends if e.ts <= t]))
    return log, t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args()
    figures: dict[str, dict[str, float]] = {}
    default_gc = gc.get_threshold()
    for collector, suffix in (("sidecar", ""), ("default", "_default_gc")):
        if collector == "sidecar":
            heap.tune()
        else:
            gc.set_threshold(*default_gc)
        for crashed in (False, True):
            times = []
            for run in range(args.runs):
                log, t = filled(args.requests, seed=run)
                c0 = time.perf_counter()
                out = log.export(t, crashed=crashed)
                times.append((time.perf_counter() - c0) * 1e3)
                assert out["counts"]["requests"] == args.requests
                del out  # freed here, not in the next run's timing (rebinding the name would)
            name = ("export_crashed" if crashed else "export") + suffix + "_ms"
            figures[name] = {"median": statistics.median(times), "best": min(times)}
            print(f"{name:<30} {args.requests:,} requests: median {statistics.median(times):.1f} ms, best {min(times):.1f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"bench": "workload", "requests": args.requests, "runs": args.runs, **figures}, fh, indent=2)


if __name__ == "__main__":
    main()
