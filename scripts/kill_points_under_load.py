"""The kill points under node load, full size: a real ``flightrec serve`` SIGKILLed at each point
of a snapshot while ``flightrec simulate`` writes 8 engines' rings (256 running requests, 100
steps/s each) and serves their ``/metrics``, which the sidecar scrapes; then started again under
the same load. Each point: one Xid per engine written at once (8 faults, each its own engine and
bus), the kill when the first Xid snapshot reaches the point, the restart, and the guarantees of
``tests/faults/under_load.py`` asserted: every fault's snapshot stored exactly once, of its
engine, with its own time and the rings at that time; its event row once; no step row twice.

    python scripts/kill_points_under_load.py                       # 8 x 256 x 100, every point
    python scripts/kill_points_under_load.py --engines 4 --running 64 --points intent_tmp

Prints one line per point and the machine's load; exits 1 at the first point whose guarantees
fail (its assertion printed). The CI test, scaled down, is ``tests/faults/test_kill_points_under_load.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.faults.kill_at import POINTS  # noqa: E402
from tests.faults.under_load import NodeLoad, run_case  # noqa: E402


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps-per-second", type=float, default=100.0)
    p.add_argument("--faults", type=int, help="Xid faults per point, one per engine (default: every engine)")
    p.add_argument("--points", nargs="*", default=list(POINTS), choices=POINTS)
    args = p.parse_args()
    faults = min(args.faults or args.engines, args.engines)
    work = Path(tempfile.mkdtemp(prefix="flightrec-kill-under-load-"))
    load = NodeLoad(args.engines, args.running, args.steps_per_second, work / "load")
    print(f"load: {args.engines} engines x {args.running} running x {args.steps_per_second:g} steps/s, /metrics scraped; {faults} faults a point")
    print(f"machine load at start {loadavg()} ({__import__('os').cpu_count()} CPUs)", flush=True)
    load.start()
    t0 = time.monotonic()
    rc = 0
    try:
        for point in args.points:
            try:
                print(run_case(load, work / point, point, faults) + f"  [load {loadavg()}]", flush=True)
            except AssertionError:
                print(f"{point:>12}: FAILED", flush=True)
                traceback.print_exc()
                rc = 1
                break
    finally:
        load.stop()
    print(f"{len(args.points)} points in {time.monotonic() - t0:.0f} s; machine load at end {loadavg()}")
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
