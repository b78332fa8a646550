"""Cost of making a trigger durable: one trigger intent written (temporary file, fsync, rename,
fsync of the folder), which the committer does on the event loop before a snapshot is captured.

    python bench/bench_intent.py [--n 200] [--dir FOLDER]

Prints the median, p90, p99 and max of ``n`` writes of a typical Xid event's intent, in the
folder given (default: a temporary folder, where ``tempfile`` puts one; pass the spool
folder's file system to measure that disk). Each intent is removed after it is written, as the
committer does once the snapshot is committed. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collector.model import Event, EventKind, Severity
from collector.snapshot import intent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--dir", default=None, help="folder to write in (default: a temporary one)")
    args = p.parse_args()
    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="flightrec-bench-intent-"))
    times = []
    size = 0
    for i in range(args.n):
        ev = Event(
            kind=EventKind.XID,
            ts=time.time(),
            source="kmsg",
            severity=Severity.CRITICAL,
            xid=79,
            pid=3107,
            gpu="0000:18:00.0",
            message="NVRM: Xid (PCI:0000:18:00): 79, pid=3107, GPU has fallen off the bus.",
            uid=f"{i:032x}",
        )
        t0 = time.perf_counter()
        path = intent.write(folder, "decode-0", ev, time.time())
        times.append(time.perf_counter() - t0)
        size = path.stat().st_size
        intent.remove(path)
    times.sort()
    ms = [t * 1000 for t in times]
    print(f"intent writes: {args.n}, {size} bytes each, in {folder}")
    print(f"  median {statistics.median(ms):.2f} ms, p90 {ms[int(0.9 * len(ms))]:.2f} ms, p99 {ms[int(0.99 * len(ms))]:.2f} ms, max {ms[-1]:.2f} ms")


if __name__ == "__main__":
    main()
