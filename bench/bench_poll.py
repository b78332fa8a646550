"""What the recorder's poll costs at the sidecar's own cadence, against the same poll warm.

    python bench/bench_poll.py                         # 8 engines x 256 running x 100 steps/s, 10 s
    python bench/bench_poll.py --engines 8 --seconds 20

A load simulator (``flightrec simulate``, a child process) writes 8 engines' rings. In this
process a ``RecorderSource`` over them (the sidecar's, with a sink that keeps nothing) is polled:

- at the sidecar's cadence (every 0.1 s on the shared ticks, each ring read once it holds a
  second of records): CPU (this thread's) of a poll that reads nothing (the 16 ring headers
  looked at) and of a poll that reads, medians, and the share of a core of each kind;
- back to back, the same poll that reads nothing, 200 times: its median warm;
- by part, at the cadence: the share of a core in the rings' reads (``RingReader.read_views``),
  their decode (``decode_read``), and in that the ``W`` records' (``_work_batch``).

``--sim-arg=--no-workload-records`` (no ``W`` records) and ``--sim-arg=--osl --sim-arg=100000``
(no request ends within the run: no ``W`` records, and every ``R`` record keeps its running set)
say what the running set's churn costs the reads.

The first against the last is what running in short bursts ten times a second costs on this
machine: the poll's code and data are no longer in the caches when it runs. A per-record cost
measured in a tight loop (``bench_work_records.py``, ``bench_ring_read.py``) is a floor of what it
costs in the sidecar, not its figure.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import collector.channel.reads as reads  # noqa: E402
import collector.sources.recorder as recorder  # noqa: E402
from collector.channel.ringfile import RingReader  # noqa: E402
from collector.sources.recorder import RecorderSource  # noqa: E402

PARTS: dict[str, float] = {}


def _timed(owner: Any, name: str, label: str) -> None:
    """Add the CPU time of each call of ``owner.name`` to ``PARTS[label]``."""
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            PARTS[label] = PARTS.get(label, 0.0) + time.thread_time() - t0

    setattr(owner, name, timed)


class _Sink:
    def emit(self, item: object) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps-per-second", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--sim-arg", action="append", default=[], help="more arguments for the load simulator (e.g. --sim-arg=--no-workload-records)")
    args = p.parse_args()
    logging.disable(logging.WARNING)  # (the rings join no configured engine: said once each)
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-poll-") as tmp:
        rings = Path(tmp) / "rings"
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "simulate",
                "--engines",
                str(args.engines),
                "--running",
                str(args.running),
                "--steps-per-second",
                str(args.steps_per_second),
                "--duration",
                str(args.seconds + 15),
                "--recorder-dir",
                str(rings),
                "--write-config",
                str(Path(tmp) / "sim.yaml"),
                *args.sim_arg,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not rings.exists() or len(list(rings.glob("*.ring"))) < 2 * args.engines:
                time.sleep(0.2)
            time.sleep(2.0)
            src = RecorderSource(rings, read_every=1.0)
            sink = _Sink()
            src.poll(sink)  # the first catch-up, whole
            _timed(RingReader, "read_views", "reads")
            _timed(recorder, "decode_read", "decode")
            _timed(reads, "_work_batch", "decode: W records")
            idle: list[float] = []
            reading: list[float] = []
            end = time.monotonic() + args.seconds
            nxt = time.monotonic()
            while time.monotonic() < end:
                nxt += 0.1
                time.sleep(max(0.0, nxt - time.monotonic()))
                t0 = time.thread_time()
                n = src.poll(sink)
                (reading if n else idle).append(time.thread_time() - t0)
            parts = dict(PARTS)
            warm_src = RecorderSource(rings, read_every=1e9)  # reads its first catch-up, then never again
            warm_src.poll(sink)
            warm: list[float] = []
            for _ in range(200):
                t0 = time.thread_time()
                warm_src.poll(sink)
                warm.append(time.thread_time() - t0)
        finally:
            load.terminate()
            load.wait()
    load_avg = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if os.path.exists("/proc/loadavg") else "?"
    rings_n = 2 * args.engines
    print(f"{args.engines} engines x {args.running} running x {args.steps_per_second:g} steps/s, {rings_n} rings; load {load_avg}")
    print(f"poll reading nothing, every 0.1 s     {statistics.median(idle) * 1e6:8.0f} us median ({len(idle)} polls)")
    print(f"poll reading nothing, back to back    {statistics.median(warm) * 1e6:8.0f} us median ({len(warm)} polls)")
    print(f"poll that reads, every 0.1 s          {statistics.median(reading) * 1e6:8.0f} us median ({len(reading)} polls)")
    print(
        f"share of a core at the cadence         {100 * sum(idle) / args.seconds:.2f}% idle polls, "
        f"{100 * sum(reading) / args.seconds:.2f}% reading polls (decode, no filing)"
    )
    print("by part, share of a core at the cadence " + ", ".join(f"{k} {100 * v / args.seconds:.2f}%" for k, v in parts.items()))


if __name__ == "__main__":
    main()
