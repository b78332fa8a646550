"""One node-wide fault: an Xid that matches no engine goes to every engine, and each engine's
snapshot is committed. Times, from the trigger, when each of the engines' snapshots is durable
(the committer's ``on_committed``, called after its transaction), in process, on a migrated
database.

    python bench/bench_node_wide_fault.py --engines 8 --steps 1024 --requests 64
    python bench/bench_node_wide_fault.py --db postgresql+psycopg://postgres@127.0.0.1:5432/test

The snapshots of one trigger are committed in one transaction: the first and the last are
durable at the same moment, after every document is built (the builds share one core).
``--one-at-a-time`` commits each engine's snapshot in its own transaction after its own build,
as the committer did before, for the comparison.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.request_columns: rows as the recorder writes them

from collector.channel.blocks import RequestBlock  # noqa: E402
from collector.channel.ringfile import RingReader, RingWriter  # noqa: E402
from collector.ingest.hub import Hub  # noqa: E402
from collector.ingest.intake import Intake  # noqa: E402
from collector.ingest.live import LiveView  # noqa: E402
from collector.model import HALF_REQUESTS, HALF_STATS, Event, EventKind, Severity, StepRecord  # noqa: E402
from collector.settings import EngineConfig, Settings  # noqa: E402
from collector.snapshot.commit import Job  # noqa: E402
from collector.snapshot.committer import SnapshotCommitter  # noqa: E402
from collector.storage.connect import make_engine  # noqa: E402
from collector.storage.migrate import upgrade  # noqa: E402
from collector.storage.repo import Repository  # noqa: E402
from tests.request_columns import Row, encode_rows, with_rows  # noqa: E402


async def one_fault(args: argparse.Namespace, db: str, spool: Path) -> tuple[float, list[float]]:
    names = [f"e{i}" for i in range(args.engines)]
    settings = Settings(engines=[EngineConfig(name=n, url=f"http://{n}") for n in names], ring_steps=args.steps, host_name="bench")
    intake = Intake(settings)
    done: list[float] = []
    c = SnapshotCommitter(
        LiveView(intake),
        Repository(make_engine(db), host="bench"),
        spool_dir=spool,
        settle_s=60.0,
        window_s=30.0,
        on_committed=[lambda doc, ev: done.append(time.time())],
    )
    if args.one_at_a_time:
        put = c.queue.put

        def one_at_a_time(job: Job) -> None:
            for i, o in enumerate(job.opens):
                put(Job([o], [job.captures[i]] if job.captures is not None else None, job.amend))

        c.queue.put = one_at_a_time  # type: ignore[method-assign]
    hub = Hub(intake, consumers=[c.on_event])
    t0 = time.time() - args.steps * 0.01
    readers = []
    for n in names:
        ring = None
        if not args.held_blocks:  # as the sidecar holds them: their place in the engine's ring
            ring = RingWriter(spool.parent / f"{n}.ring", capacity=16 << 20)
            readers.append(RingReader(spool.parent / f"{n}.ring"))
        for i in range(args.steps):
            ts = t0 + i * 0.01
            hub.emit(StepRecord(engine=n, ts=ts, step=i, running=args.requests, waiting=0, generation_tokens=args.requests, halves=HALF_STATS))
            rows = [Row(f"cmpl-{j:04d}-{n}", 32000, 32000 + i, i, 0, "running", 400 + j) for j in range(args.requests)]
            if ring is None:
                hub.emit(with_rows(StepRecord(engine=n, ts=ts, step=i), rows))
                continue
            ring.append(encode_rows(i, ts, rows))
            places: list[int] = []
            (view,) = readers[-1].read_views(places=places)
            block = RequestBlock.in_ring(view, readers[-1].records(), places[0])
            hub.emit(StepRecord(engine=n, ts=ts, step=i, request_block=block, halves=HALF_REQUESTS, running=block.running))
    task = asyncio.create_task(c.run())
    await asyncio.sleep(0.2)
    trigger = Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message="Xid 79", xid=79, gpu="0000:99:00.0", severity=Severity.CRITICAL)
    hub.emit(trigger)
    on_loop = time.time() - trigger.ts  # the policy's part: intents written, every ring captured
    while len(done) < args.engines:
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return on_loop, [t - trigger.ts for t in done]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--steps", type=int, default=1024)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--db", help="a database URL (default: a SQLite file per run)")
    p.add_argument("--one-at-a-time", action="store_true", help="one transaction per engine, each after its own build")
    p.add_argument("--held-blocks", action="store_true", help="request blocks held as copies (before: the sidecar now keeps their place in the ring)")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args()
    loops, firsts, lasts = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            db = args.db or f"sqlite:///{tmp}/b.db"
            upgrade(db)
            on_loop, after = asyncio.run(one_fault(args, db, Path(tmp) / "spool"))
        loops.append(on_loop)
        firsts.append(min(after))
        lasts.append(max(after))
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms"  # noqa: E731
    how = ("one transaction per engine" if args.one_at_a_time else "one transaction") + (", blocks held" if args.held_blocks else ", blocks in ring")
    print(f"{args.engines} engines x {args.steps} steps x {args.requests} requests, {how}, {args.runs} runs (medians)")
    print(f"  trigger -> intents and captures done (on the loop): {ms(loops)}")
    print(f"  trigger -> first snapshot durable:                 {ms(firsts)}")
    print(f"  trigger -> last snapshot durable:                  {ms(lasts)}  (spread {ms([b - a for a, b in zip(firsts, lasts, strict=True)])})")
    if args.json:
        med = lambda xs: round(statistics.median(xs) * 1e3, 1)  # noqa: E731
        out = {
            "engines": args.engines,
            "runs": args.runs,
            "one_at_a_time": args.one_at_a_time,
            "blocks": "held" if args.held_blocks else "in ring",
            "on_loop_ms": med(loops),
            "first_durable_ms": med(firsts),
            "last_durable_ms": med(lasts),
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
