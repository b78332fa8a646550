"""Freezing a full ring into a snapshot document, and encoding its parts: the in-process half of
"fault to durable snapshot" (bench_fault_to_snapshot.py times the whole path).

    .venv/bin/python bench/bench_freeze.py [--steps 4096] [--requests 64] [--runs 7]

Prints medians in milliseconds: hub.freeze (on the event loop) and pack_parts (in a thread).
"""

from __future__ import annotations

import argparse
import statistics
import time

from collector.ingest.hub import Hub
from collector.model import Event, EventKind, RequestRow, StepRecord
from collector.settings import EngineConfig, Settings
from collector.storage.repo import pack_parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    hub = Hub(Settings(engines=[EngineConfig(name="d", url="http://d")], ring_steps=args.steps))
    for i in range(args.steps):  # what the recorder delivers: a stats half and a requests half
        hub.emit(StepRecord(engine="d", ts=1000 + i * 0.025, step=i, running=args.requests, connector={"mirror_rows": 10}))
        rows = [RequestRow(f"cmpl-{j:04d}-abcdef12", 32000, 32000 + i, i, 0, "running", 400 + j) for j in range(args.requests)]
        hub.emit(StepRecord(engine="d", ts=1000 + i * 0.025, step=i, requests=rows))
    trigger = Event(kind=EventKind.XID, ts=1000 + args.steps * 0.025, source="kmsg", message="Xid 43")
    freeze, pack = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        doc = hub.freeze("d", trigger)
        t1 = time.perf_counter()
        blobs = pack_parts(doc)
        freeze.append(t1 - t0)
        pack.append(time.perf_counter() - t1)
    size = sum(len(b) for b in blobs.values())
    print(f"ring {args.steps} steps x {args.requests} requests ({len(doc.requests)} request rows), {args.runs} runs")
    print(f"  freeze (hub.freeze):      median {statistics.median(freeze) * 1e3:.0f} ms")
    print(f"  encode (pack_parts):      median {statistics.median(pack) * 1e3:.0f} ms  ({size / 1e3:.0f} kB gzip)")


if __name__ == "__main__":
    main()
