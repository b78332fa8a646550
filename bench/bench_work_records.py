"""What a ring read's ``W`` records (requests arriving and ending) cost the sidecar: decoded and
filed into the workload log, as columns (``collector.channel.work_columns``) or one by one, by
the number of records a read holds.

    .venv/bin/python bench/bench_work_records.py [--steps 2000] [--sizes 30,64,100,300,1000]

The simulator's load model writes ``--steps`` steps of one engine at 256 running (its arrivals
and ends, about 1.6 records a step); the records are cut into reads of each size and decoded
(``decode_work_records``) and filed (``WorkloadLog.add``) into a fresh log, both ways, in turn.
Prints CPU microseconds per record (best of 7), for decoding alone and with the filing. At node
scale an engine's read holds about 200 (a read a second at 100 steps/s); a ring's first catch-up
thousands. ``work_columns.COLUMNS_FROM`` is where the two cross.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from collector import heap
from collector.channel import work_columns
from collector.channel.codec import TAG_WORK
from collector.channel.ringfile import RingReader
from collector.channel.work_columns import decode_work_records
from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadBatch
from collector.sim.load import EngineLoad, LoadConfig


def records(steps: int) -> list[bytes]:
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-work-") as tmp:
        folder = Path(tmp)
        t = [1_000_000.0]
        load = EngineLoad(LoadConfig(recorder_dir=folder, engines=1, running=256), 0, clock=lambda: t[0])
        for _ in range(steps):
            t[0] += 0.01
            load.step()
        load.close()
        out: list[bytes] = []
        for path in sorted(folder.glob("*.ring")):
            out += [p for p in RingReader(path).read(1 << 30) if p[:1] == TAG_WORK]
    return out


def best_us(fn: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(7):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return min(times) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--sizes", default="30,64,100,300,1000")
    args = p.parse_args()
    work = records(args.steps)
    heap.tune()
    print(f"bench_work_records: {len(work):,} W records of {args.steps:,} steps at 256 running; us per record, best of 7")
    print(f"{'records a read':>14} {'decode: columns':>16} {'one by one':>11} {'+ filing: columns':>18} {'one by one':>11}")
    for size in [int(s) for s in args.sizes.split(",")]:
        reads = [work[i : i + size] for i in range(0, len(work), size)]
        row = []
        for with_log in (False, True):
            for columns_from in (0, 1 << 30):

                def run(columns_from: int = columns_from, with_log: bool = with_log) -> None:
                    work_columns.COLUMNS_FROM = columns_from
                    log = WorkloadLog()
                    for read in reads:
                        recs, _ = decode_work_records(read)
                        if with_log:
                            log.add(WorkloadBatch("e", 0.0, recs))

                row.append(best_us(run, len(work)))
        print(f"{size:>14} {row[0]:>16.2f} {row[1]:>11.2f} {row[2]:>18.2f} {row[3]:>11.2f}")


if __name__ == "__main__":
    main()
