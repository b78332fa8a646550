"""``flightrec report --bundle`` at node scale: the scrubbed archive of a ``--steps`` x
``--running`` snapshot (tests/report/synthetic.py builds it in memory, ids turning over as the
recorder writes them), its size against the 10 MB an issue takes, and the time of each stage.

    python bench/bench_report_bundle.py [--steps 4096] [--running 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "report"))
from synthetic import big_export  # noqa: E402

from collector.report.bundle import MAX_BUNDLE_BYTES, build_bundle  # noqa: E402
from collector.report.markdown import render  # noqa: E402
from collector.report.scrub import Scrubber  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    export = big_export(args.steps, args.running)
    rows = len(export["requests"]["columns"]["step"])
    scrub_s, total_s, sizes = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        Scrubber().export(export)
        scrub_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        body = build_bundle(export, report=render)
        total_s.append(time.perf_counter() - t0)
        sizes.append(len(body))
    print(f"snapshot: {args.steps} steps x {args.running} running = {rows} request rows")
    print(f"bundle: {sizes[-1] / 1e6:.2f} MB (limit {MAX_BUNDLE_BYTES / 1e6:.0f} MB)")
    print(f"scrub only: median {statistics.median(scrub_s):.2f} s")
    print(f"whole bundle (scrub, JSON, report, gzip): median {statistics.median(total_s):.2f} s, min {min(total_s):.2f} s over {args.repeats}")
    print(f"loadavg: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cpus: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
