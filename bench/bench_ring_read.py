"""Cost of reading a ring file: the sidecar's side of the recorder channel.

    python bench/bench_ring_read.py [--repeat 30] [--baseline OLD_RINGFILE.py]

Cases, each printed as the median and p90 of its runs:

- ``catch_up``: a fresh reader reads a full 16 MiB ring of typical records (one step record of
  ~80 bytes, then one request record of 256 rows, ~5.6 KB, per engine step): what a sidecar
  restart pays per engine;
- ``poll``: the writer appends one step's two records (or ten steps'), the reader reads them:
  the steady-state cost of one poll.

``--baseline`` names another version of ``collector/channel/ringfile.py`` (e.g. ``git show
COMMIT:collector/channel/ringfile.py > /tmp/old.py``): its reader runs on the same ring in the
same process, alternating with the current one, so machine load weighs on both alike.

``--crc`` prints only the reader's CRC-32 (ISA-L's where installed) against zlib's, per record.

Figures go into BENCHMARKS.md by hand; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import timeit
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collector.channel import ringfile  # noqa: E402
from collector.channel.codec import encode_step_fields  # noqa: E402
from tests.request_columns import Row, encode_rows  # noqa: E402

CAPACITY = 16 << 20


def _records(step: int) -> tuple[bytes, bytes]:
    rows = [Row(f"cmpl-{step}-{i}", 32000, 32000 + step, step, 0, "running", 8) for i in range(256)]
    return (encode_step_fields(step, 1.7e9 + step, 0, 256, 4, 0, 0.5, 0, 0, 256, 0, 0, 0), encode_rows(step, 1.7e9 + step, rows))


def _stats(samples: list[float]) -> str:
    samples = sorted(samples)
    return f"median {statistics.median(samples):9.1f} us   p90 {samples[int(len(samples) * 0.9)]:9.1f} us"


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_ringfile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _crc() -> None:
    """The reader's CRC-32 (``ringfile.reader_crc32``) against zlib's on a record of each kind."""
    check = ringfile.reader_crc32()
    print(f"reader's CRC-32: {check.__module__}.{check.__name__}")
    step, reqs = _records(7)
    reqs = reqs * 2  # about the 15 kB of 256 running requests with vLLM's ids
    for name, payload in (("S record", step), (f"R record ({len(reqs) // 1000} kB)", reqs)):
        for label, fn in (("zlib", zlib.crc32), ("reader", check)):
            n = 20_000
            best = min(timeit.repeat(lambda fn=fn, payload=payload: fn(payload), number=n, repeat=7)) / n * 1e6  # type: ignore[misc]
            print(f"{label:<7} {name:<20} {best:8.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--baseline", help="another ringfile.py whose reader to measure alongside")
    ap.add_argument("--crc", action="store_true", help="only the reader's CRC-32 against zlib's, per record size")
    args = ap.parse_args()
    if args.crc:
        _crc()
        return
    impls: dict[str, Any] = {"current": ringfile}
    if args.baseline:
        impls["baseline"] = _load(args.baseline)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in impls}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.ring"
        writer = ringfile.RingWriter(path, capacity=CAPACITY)
        step = 0
        while writer.head < 2 * CAPACITY:  # wrapped: the ring is full
            for payload in _records(step):
                writer.append(payload)
            step += 1
        records = 0
        for i in range(args.repeat):
            for name, impl in list(impls.items()) if i % 2 else list(reversed(impls.items())):
                start = time.perf_counter()
                reader = impl.RingReader(path)
                records = len(reader.read(max_records=1_000_000))
                results[name].setdefault(f"catch_up ({records} records, 16 MiB)", []).append((time.perf_counter() - start) * 1e6)
                reader.close()
        for steps in (1, 10):  # a poll per step, or per ten steps (50 ms at 200 steps/s)
            readers = {name: impl.RingReader(path) for name, impl in impls.items()}
            for reader in readers.values():
                reader.read(max_records=1_000_000)
            for i in range(args.repeat * 100 // steps):
                for _ in range(steps):
                    for payload in _records(step):
                        writer.append(payload)
                    step += 1
                for name, reader in list(readers.items()) if i % 2 else list(reversed(readers.items())):
                    start = time.perf_counter()
                    got = reader.read()
                    results[name].setdefault(f"poll ({2 * steps} records, ~{5.7 * steps:.0f} KB)", []).append((time.perf_counter() - start) * 1e6)
                    assert len(got) == 2 * steps
            for reader in readers.values():
                reader.close()
        writer.close()
    for name, cases in results.items():
        for case, samples in cases.items():
            print(f"{name:<9} {case:<34} {_stats(samples)}")


if __name__ == "__main__":
    main()
