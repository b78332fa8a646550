"""Freezing a full ring into a snapshot document, and encoding its parts: the in-process half of
"fault to durable snapshot" (bench_fault_to_snapshot.py times the whole path).

    .venv/bin/python bench/bench_freeze.py [--steps 4096] [--requests 64] [--runs 7]

Prints medians in milliseconds: the capture (on the event loop: references only), the document
build and the encode of its parts (both in a thread), and the first read of the stored requests
part (decoding the recorder's blocks into the export's columns).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.request_columns: rows as the recorder writes them

from collector.channel.blocks import pack_blocks  # noqa: E402
from collector.ingest.hub import hub_for  # noqa: E402
from collector.model import HALF_STATS, Event, EventKind, StepRecord  # noqa: E402
from collector.settings import EngineConfig, Settings  # noqa: E402
from collector.snapshot.document import RequestTable  # noqa: E402
from collector.snapshot.freeze import capture  # noqa: E402
from collector.storage.repo import pack_parts  # noqa: E402
from tests.request_columns import Row, with_rows  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--request-bytes", type=int, default=8 << 20, help="ring_request_bytes")
    p.add_argument("--random-ids", action="store_true", help="vLLM-like ids (cmpl-<32 random hex>-0), new every step")
    args = p.parse_args()
    hub = hub_for(Settings(engines=[EngineConfig(name="d", url="http://d")], ring_steps=args.steps, ring_request_bytes=args.request_bytes))
    for i in range(args.steps):  # what the recorder delivers: a stats half and a requests half
        hub.emit(
            StepRecord(
                engine="d",
                ts=1000 + i * 0.025,
                step=i,
                running=args.requests,
                waiting=0,
                kv_cache_usage=0.03,
                preemptions=0,
                prompt_tokens=0,
                generation_tokens=args.requests,
                connector={"mirror_rows": 10},
                halves=HALF_STATS,
            )
        )
        ids = (
            [f"cmpl-{random.getrandbits(128):032x}-0" for _ in range(args.requests)]
            if args.random_ids
            else [f"cmpl-{j:04d}-abcdef12" for j in range(args.requests)]
        )
        rows = [Row(ids[j], 32000, 32000 + i, i, 0, "running", 400 + j) for j in range(args.requests)]
        hub.emit(with_rows(StepRecord(engine="d", ts=1000 + i * 0.025, step=i), rows))
    trigger = Event(kind=EventKind.XID, ts=1000 + args.steps * 0.025, source="kmsg", message="Xid 43")
    cap_t, build_t, pack_t, read_t, zlib_t = [], [], [], [], []
    zlib_size = 0
    for _ in range(args.runs):
        t0 = time.perf_counter()
        cap = capture(hub.view, "d", trigger, gpu_seconds=300)
        t1 = time.perf_counter()
        doc = cap.build()
        t2 = time.perf_counter()
        blobs = pack_parts(doc)
        t3 = time.perf_counter()
        RequestTable.from_stored(blobs["requests"]).json_bytes()
        t4 = time.perf_counter()
        blocks = doc.requests.blocks or []
        zlib_size = len(pack_blocks(blocks, level=1))  # the form not chosen: for the comparison
        zlib_t.append(time.perf_counter() - t4)
        cap_t.append(t1 - t0)
        build_t.append(t2 - t1)
        pack_t.append(t3 - t2)
        read_t.append(t4 - t3)
    size = sum(len(b) for b in blobs.values())
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.1f} ms"  # noqa: E731
    print(
        f"ring {args.steps} steps x {args.requests} requests: {len(doc.requests)} request rows held "
        f"({args.request_bytes >> 20} MiB of blocks), {args.runs} runs"
    )
    print(f"  capture (on the loop):       median {ms(cap_t)}")
    print(f"  build the document (thread): median {ms(build_t)}")
    print(f"  encode the parts (thread):   median {ms(pack_t)}  ({size / 1e3:.0f} kB stored)")
    print(f"  first read of the requests:  median {ms(read_t)}  (decode blocks + JSON, then cached)")
    print(f"  (blocks zlib level 1 instead: median {ms(zlib_t)}, {len(blobs['requests']) / 1e3:.0f} -> {zlib_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
