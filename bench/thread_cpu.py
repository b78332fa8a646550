"""Where a running sidecar's CPU goes, by thread: each thread's utime + stime over a window, named
by py-spy's dump of the process (the Python thread names: ``MainThread`` is the event loop,
``flightrec-scrape_N`` the scrape threads, ``flightrec_N`` the writer's and committer's pool).

    python bench/thread_cpu.py PID [--seconds 30]

Threads of one pool are summed under one name (``flightrec-scrape_N``). Prints each name's share
of one core; a thread py-spy does not name (a C library's own) is ``native``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

_THREAD = re.compile(r"Thread (\d+) \(\w+\)(?:: \"(.*)\")?")


def cpu_ticks(pid: int) -> dict[str, int]:
    """utime + stime of each thread of ``pid``, in clock ticks, by thread id."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = int(fields[11]) + int(fields[12])
    return out


def thread_names(pid: int) -> dict[str, str]:
    """Thread id -> Python thread name, from ``py-spy dump``; empty when py-spy cannot run."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run([spy, "dump", "-p", str(pid), "--nonblocking"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {m.group(1): m.group(2) or "?" for line in dump.splitlines() if (m := _THREAD.match(line))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pid", type=int)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    names = thread_names(args.pid)
    tick = os.sysconf("SC_CLK_TCK")
    before, t0 = cpu_ticks(args.pid), time.monotonic()
    time.sleep(args.seconds)
    after, elapsed = cpu_ticks(args.pid), time.monotonic() - t0
    shares: dict[str, float] = {}
    for tid, ticks in after.items():
        name = re.sub(r"_\d+$", "_N", names.get(tid, "native"))
        shares[name] = shares.get(name, 0.0) + (ticks - before.get(tid, 0)) / tick / elapsed
    print(f"pid {args.pid}: {100 * sum(shares.values()):.2f}% of a core over {elapsed:.0f} s; load {os.getloadavg()[0]:.2f}")
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<24} {100 * share:6.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
