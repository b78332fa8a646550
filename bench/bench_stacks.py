"""What reading a wedged engine's stacks costs: one py-spy dump per process, non-blocking and
native, and what the target process and the sidecar's event loop feel of it.

    .venv/bin/python bench/bench_stacks.py [--repeat 7] [--torch-python PY] [--pid PID ...] [--json FILE]

Targets: a Python process blocked like a wedged engine core (tests/stacks/blocked_child.py),
the same with torch imported (``--torch-python``: a python that has torch, e.g. the vLLM CPU
virtualenv's; the native dump reads libtorch's symbols), and any running process (``--pid``, e.g.
a real vLLM server's engine core, API server and worker). For each, per dump:

- wall time of ``py-spy dump`` (what a snapshot waits per round: the processes run in parallel);
- py-spy's own CPU time (user + system, from ``wait4``);
- for the targets started here, the longest the target's ticker thread (``sleep(1 ms)`` in a
  loop) went without running during the dump: the pause the target felt (``--nonblocking`` must
  be close to the idle baseline; ``--native`` stops every thread while it unwinds).

And one whole capture (``StackReader.capture``, two rounds ``--interval`` apart) with the event
loop's heartbeat beside it: the loop's longest lateness during the capture (it must stay that of
an idle loop: the dumps run in the reader's threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.stacks import pyspy  # noqa: E402
from collector.stacks.capture import StackReader  # noqa: E402
from collector.stacks.settings import StacksSettings  # noqa: E402

# The target: blocked_child's hang, plus a ticker thread that prints each gap over 2 ms.
TARGET = """
import runpy, sys, threading, time
if len(sys.argv) > 2 and sys.argv[2] == "torch":
    import torch  # noqa: F401  (the libraries a real engine maps)
def ticker():
    last = time.monotonic()
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        if now - last > 0.002:
            print(f"gap {now:.6f} {now - last:.6f}", flush=True)
        last = now
threading.Thread(target=ticker, name="ticker", daemon=True).start()
sys.argv = [sys.argv[1], "VLLM::EngineCore"]  # titled as vLLM's engine core: the reader's role for it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Target:
    def __init__(self, python: str, *, torch: bool) -> None:
        args = [python, "-c", TARGET, str(ROOT / "tests" / "stacks" / "blocked_child.py")] + (["torch"] if torch else [])
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        self.gaps: list[tuple[float, float]] = []
        assert self.p.stdout is not None
        while True:
            line = self.p.stdout.readline()
            if not line or line.strip() == "ready":
                break
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "gap":
                self.gaps.append((float(parts[1]), float(parts[2])))

    def longest_gap(self, t0: float, t1: float) -> float:
        """The longest the ticker did not run within [t0, t1] (monotonic), in seconds."""
        time.sleep(0.05)  # its line for a gap ending at t1
        return max([g for end, g in self.gaps if t0 <= end <= t1 + 0.05] + [0.0])

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


def one_dump(binary: str, pid: int, *, native: bool) -> tuple[float, float, bool]:
    """(wall s, py-spy CPU s, ok) of one dump."""
    t0 = time.monotonic()
    p = subprocess.Popen(pyspy.command(binary, pid, native=native), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - t0, usage.ru_utime + usage.ru_stime, p.returncode == 0


def measure(binary: str, pid: int, repeat: int, target: Target | None) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": pid}
    if target is not None:  # the ticker's gaps with nothing reading the process
        t0 = time.monotonic()
        time.sleep(1.0)
        out["idle_gap_ms"] = round(target.longest_gap(t0, time.monotonic()) * 1000, 2)
    for mode, native in (("nonblocking", False), ("native", True)):
        walls, cpus, gaps, failed = [], [], [], 0
        for _ in range(repeat):
            t0 = time.monotonic()
            wall, cpu, ok = one_dump(binary, pid, native=native)
            t1 = time.monotonic()
            if not ok:
                failed += 1
                continue
            walls.append(wall)
            cpus.append(cpu)
            if target is not None:
                gaps.append(target.longest_gap(t0, t1))
            time.sleep(0.2)
        out[mode] = {
            "dumps": len(walls),
            "failed": failed,
            "wall_ms_median": round(statistics.median(walls) * 1000, 1) if walls else None,
            "wall_ms_max": round(max(walls) * 1000, 1) if walls else None,
            "cpu_ms_median": round(statistics.median(cpus) * 1000, 1) if cpus else None,
            "target_gap_ms_median": round(statistics.median(gaps) * 1000, 1) if gaps else None,
            "target_gap_ms_max": round(max(gaps) * 1000, 1) if gaps else None,
        }
    return out


async def capture_with_heartbeat(pid: int, interval: float, native: bool) -> dict[str, Any]:
    reader = StackReader(StacksSettings(interval_s=interval, native=native), recorder_dir=None)
    late: list[float] = []
    stop = False

    async def beat() -> None:
        while not stop:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            late.append(time.monotonic() - t - 0.01)

    hb = asyncio.create_task(beat())
    await asyncio.sleep(1.0)
    idle = max(late)
    late.clear()
    t0 = time.monotonic()
    doc = await reader.capture("bench", {"engine_core_pid": pid})
    took = time.monotonic() - t0
    stop = True
    await hb
    reader.close()
    return {
        "status": doc["status"],
        "reasons": doc["reasons"],
        "seconds": round(took, 2),
        "loop_lateness_ms_idle_max": round(idle * 1000, 1),
        "loop_lateness_ms_during_max": round(max(late) * 1000, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--torch-python", help="a python with torch installed: a target with libtorch mapped")
    ap.add_argument("--pid", type=int, action="append", default=[], help="also measure this running process (no pause measure)")
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    binary = pyspy.find_binary()
    if binary is None:
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"py_spy": pyspy.version(binary), "load_before": os.getloadavg(), "targets": {}}
    targets = [("python (blocked)", sys.executable, False)] + ([("python + torch (blocked)", args.torch_python, True)] if args.torch_python else [])
    for name, python, torch in targets:
        t = Target(python, torch=torch)
        try:
            results["targets"][name] = measure(binary, t.p.pid, args.repeat, t)
            if not torch:
                results["capture"] = asyncio.run(capture_with_heartbeat(t.p.pid, args.interval, native=False))
                results["capture_native"] = asyncio.run(capture_with_heartbeat(t.p.pid, args.interval, native=True))
        finally:
            t.close()
    for pid in args.pid:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")[:40]
        results["targets"][f"pid {pid} ({title})"] = measure(binary, pid, args.repeat, None)
    results["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print(f"py-spy {results['py_spy']}; load average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}")
    print(f"{'target':44} {'mode':12} {'wall p50':>9} {'wall max':>9} {'py-spy CPU':>10} {'pause p50':>10} {'pause max':>10} {'idle gap':>9}")
    for name, r in results["targets"].items():
        for mode in ("nonblocking", "native"):
            m = r[mode]
            print(
                f"{name[:44]:44} {mode:12} {_ms(m['wall_ms_median']):>9} {_ms(m['wall_ms_max']):>9} {_ms(m['cpu_ms_median']):>10} "
                f"{_ms(m['target_gap_ms_median']):>10} {_ms(m['target_gap_ms_max']):>10} {_ms(r.get('idle_gap_ms')):>9}"
                + (f"  ({m['failed']} failed)" if m["failed"] else "")
            )
    for key, how in (("capture", "non-blocking"), ("capture_native", "the second native")):
        c = results.get(key)
        if c:
            print(
                f"whole capture (2 rounds {args.interval:g} s apart, {how}): {c['seconds']} s, {c['status']}; event loop lateness max "
                f"{c['loop_lateness_ms_during_max']} ms during it (idle: {c['loop_lateness_ms_idle_max']} ms)"
            )
    return 0


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f} ms" if isinstance(v, float) else f"{v} ms"


if __name__ == "__main__":
    raise SystemExit(main())
