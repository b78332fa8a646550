"""Fault to durable snapshot, through the real sidecar service.

The service runs with its kmsg source following a file; an in-process source keeps one engine's
ring full (``--steps`` steps x ``--requests`` requests per step, the size that makes a snapshot
expensive). Each fault is a kernel Xid line appended to the followed file; we time from the
write to the moment the service reports the snapshot committed to the database (its
``on_snapshot`` hook runs after the commit). Each fault uses another PCI bus id, and the incident
window is short, so every fault opens its own snapshot.

    python bench/bench_fault_to_snapshot.py --db sqlite:///tmp/f.db --faults 50
    python bench/bench_fault_to_snapshot.py --db postgresql+psycopg://postgres@127.0.0.1:5432/test

Prints p50/p99 of write->committed and, from the snapshot manager, of trigger-seen->committed
(the difference is the kmsg source's file-poll interval, 0.25 s; /dev/kmsg itself wakes the
source at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.request_columns: rows as the recorder writes them

from collector.model import StepRecord  # noqa: E402
from collector.service import Service  # noqa: E402
from collector.settings import Settings  # noqa: E402
from tests.request_columns import Row, with_rows  # noqa: E402

ENGINE = "bench-0"


class FullRing:
    """A source that fills the engine's ring, then keeps stepping slowly."""

    name = "bench-steps"

    def __init__(self, steps: int, requests: int, rate: float) -> None:
        self.steps, self.requests, self.rate = steps, requests, rate
        self.filled = asyncio.Event()

    def _rec(self, i: int) -> StepRecord:
        now = time.time()
        reqs = [Row(f"cmpl-{j:04d}-0", 32000, 32000 + i, i, mirror_rows=400 + i // 64) for j in range(self.requests)]
        return with_rows(
            StepRecord(engine=ENGINE, ts=now, step=i, running=self.requests, waiting=0, kv_cache_usage=0.032, generation_tokens=self.requests),
            reqs,
        )

    async def run(self, sink: Any) -> None:
        for i in range(self.steps):
            sink.emit(self._rec(i))
            if i % 256 == 0:
                await asyncio.sleep(0)
        self.filled.set()
        i = self.steps
        while True:
            await asyncio.sleep(1 / self.rate)
            sink.emit(self._rec(i))
            i += 1


def pct(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="flightrec-bench-f2s-"))
    kmsg = work / "kmsg.log"
    kmsg.write_text("")
    settings = Settings(
        database=args.db,
        port=0,
        kmsg=str(kmsg),
        nvml="off",
        recorder="off",
        ring_steps=args.steps,
        incident_window_s=0.3,
        snapshot_settle_s=args.settle,
        host_name="bench-host",
    )
    ring = FullRing(args.steps, args.requests, rate=args.rate)
    svc = Service(settings, extra_sources=[ring], spool_dir=work / "spool")
    committed: dict[str, float] = {}

    def on_snapshot(doc: Any, trigger: Any) -> None:
        committed[str(trigger.message)] = time.time()

    svc.on_snapshot.append(on_snapshot)
    task = asyncio.create_task(svc.run())
    await svc.started.wait()
    await asyncio.wait_for(ring.filled.wait(), 120)
    await asyncio.sleep(1.0)
    lat: list[float] = []
    seq = 5000
    for n in range(args.faults):
        bus = f"0000:{(n % 200) + 16:02x}:00"
        seq += 1
        line = f"4,{seq},{int(time.monotonic() * 1e6)},c;NVRM: Xid (PCI:{bus}): 43, pid=3407, name=python3, channel 0x0000000a"
        t0 = time.time()
        with open(kmsg, "a") as f:
            f.write(line + "\n")
        deadline = time.monotonic() + 10
        key = None
        while time.monotonic() < deadline:
            key = next((k for k in committed if bus in k), None)
            if key is not None:
                break
            await asyncio.sleep(0.002)
        if key is None:
            print(f"fault {n}: no snapshot within 10 s")
            continue
        lat.append(committed.pop(key) - t0)
        await asyncio.sleep(args.settle + 0.4)  # let the amendment and the incident window pass
    inner = list(svc.ctx.committer.commit_latency) if svc.ctx else []
    svc.request_stop()
    await task
    backend = args.db.split(":", 1)[0]
    print(f"backend {backend}: ring {args.steps} steps x {args.requests} requests; {len(lat)} faults")
    if lat:
        print(
            f"  kmsg line written -> snapshot committed: p50 {pct(lat, 50) * 1e3:.0f} ms  p99 {pct(lat, 99) * 1e3:.0f} ms  "
            f"max {max(lat) * 1e3:.0f} ms"
        )
    if inner:
        print(
            f"  trigger seen by the hub -> committed:    p50 {pct(inner, 50) * 1e3:.0f} ms  p99 {pct(inner, 99) * 1e3:.0f} ms  "
            f"max {max(inner) * 1e3:.0f} ms"
        )
    if args.json:

        def figs(xs: list[float]) -> dict[str, Any]:
            return (
                {"n": len(xs), "p50_ms": round(pct(xs, 50) * 1e3, 1), "p99_ms": round(pct(xs, 99) * 1e3, 1), "max_ms": round(max(xs) * 1e3, 1)}
                if xs
                else {"n": 0}
            )

        out = {
            "backend": backend,
            "faults": args.faults,
            "snapshotted": len(lat),
            "written_to_committed": figs(lat),
            "seen_to_committed": figs(inner),
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite:///" + str(Path(tempfile.gettempdir()) / "flightrec-bench-f2s.db"))
    p.add_argument("--faults", type=int, default=50)
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rate", type=float, default=20.0, help="engine steps per second after the ring is full")
    p.add_argument("--settle", type=float, default=0.5)
    p.add_argument("--json", help="write the figures to this file")
    asyncio.run(main(p.parse_args()))
