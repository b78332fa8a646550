"""Cost of reading a ring file: the sidecar's side of the recorder channel.

    python bench/bench_ring_read.py [--repeat 30]

Two cases, each printed as the median and p90 of ``--repeat`` runs:

- ``catch_up``: a fresh reader reads a full 16 MiB ring of typical records (one step record of
  ~80 bytes, then one request record of 256 rows, ~5.6 KB, per engine step): what a sidecar
  restart pays per engine;
- ``poll``: the writer appends one step's two records (or ten steps'), the reader reads them:
  the steady-state cost of one poll.

Figures go into BENCHMARKS.md by hand; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collector.channel.codec import encode_requests, encode_step_fields  # noqa: E402
from collector.channel.ringfile import RingReader, RingWriter  # noqa: E402
from collector.model import RequestRow  # noqa: E402

CAPACITY = 16 << 20


def _records(step: int) -> tuple[bytes, bytes]:
    rows = [RequestRow(f"cmpl-{step}-{i}", 32000, 32000 + step, step, 0, "running", 8) for i in range(256)]
    return (encode_step_fields(step, 1.7e9 + step, 0, 256, 4, 0, 0.5, 0, 0, 256, 0, 0, 0),
            encode_requests("d", step, 1.7e9 + step, rows))


def _stats(samples: list[float]) -> str:
    samples = sorted(samples)
    return f"median {statistics.median(samples):9.1f} us   p90 {samples[int(len(samples) * 0.9)]:9.1f} us"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.ring"
        writer = RingWriter(path, capacity=CAPACITY)
        step = 0
        while writer.head < 2 * CAPACITY:  # wrapped: the ring is full
            for payload in _records(step):
                writer.append(payload)
            step += 1
        catch_up, records = [], 0
        for _ in range(args.repeat):
            start = time.perf_counter()
            reader = RingReader(path)
            got = reader.read(max_records=1_000_000)
            catch_up.append((time.perf_counter() - start) * 1e6)
            records = len(got)
            reader.close()
        polls: dict[int, list[float]] = {}
        for steps in (1, 10):  # a poll per step, or per ten steps (50 ms at 200 steps/s)
            reader = RingReader(path)
            reader.read(max_records=1_000_000)
            polls[steps] = []
            for _ in range(args.repeat * 100 // steps):
                for _ in range(steps):
                    for payload in _records(step):
                        writer.append(payload)
                    step += 1
                start = time.perf_counter()
                got = reader.read()
                polls[steps].append((time.perf_counter() - start) * 1e6)
                assert len(got) == 2 * steps
        reader.close()
        writer.close()
    print(f"catch_up ({records} records, 16 MiB): {_stats(catch_up)}")
    for steps, samples in polls.items():
        print(f"poll ({2 * steps} records, ~{5.7 * steps:.0f} KB):{' ' * (15 - len(str(steps)) * 2)}{_stats(samples)}")


if __name__ == "__main__":
    main()
