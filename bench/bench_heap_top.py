"""What a ring read's copy costs the sidecar with the heap's free top given back after it
(glibc's 128 kB give-back threshold, which a fixed mmap threshold keeps) and kept
(``collector.malloc.TRIM_THRESHOLD``).

    python bench/bench_heap_top.py [--copies 2000] [--size 750000]

Each case runs in a fresh interpreter with the sidecar's allocator settings
(``collector.malloc.tune``), the first case with the give-back threshold set back to 128 kB. A
copy is a bytes object of ``--size`` written whole (750 kB: half a second of one engine's
``R`` records at 256 running and 100 steps/s), made and freed ``--copies`` times. Prints the
CPU time and the page faults per copy.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CASE = """
import ctypes, resource, sys, time
from collector import malloc
malloc.tune()
if sys.argv[1] == "given-back":
    ctypes.CDLL("libc.so.6").mallopt(malloc.M_TRIM_THRESHOLD, 128 << 10)
size, copies = int(sys.argv[2]), int(sys.argv[3])
copy = b"\\x01" * size
del copy
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0 = time.process_time()
for _ in range(copies):
    copy = b"\\x01" * size
    del copy
cpu = time.process_time() - t0
print(cpu / copies * 1e6, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / copies)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=2000)
    p.add_argument("--size", type=int, default=750_000)
    args = p.parse_args()
    print(f"{args.copies} copies of {args.size:,} bytes; load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    for case in ("given-back", "kept"):
        out = subprocess.run(
            [sys.executable, "-c", CASE, case, str(args.size), str(args.copies)], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.split()
        print(f"free top {case:10}  {float(out[0]):8.1f} us CPU a copy  {float(out[1]):7.1f} page faults a copy")


if __name__ == "__main__":
    main()
