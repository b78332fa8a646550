"""The detector task's tick at node scale: what the once-a-second evaluation of every detector
costs on the event loop once the detectors' history (two minutes) is full.

    .venv/bin/python bench/bench_detectors.py [--engines 8] [--seconds 130] [--ticks 60] [--json FILE]
    PYTHONPATH=../other-checkout .venv/bin/python bench/bench_detectors.py   # that checkout's

The simulator's load model writes ``--seconds`` of steps (100 a second, 256 running) of each
engine into its rings, one ``RecorderSource.poll`` a second files them into a ``Hub`` (its per-
second folds are what the detectors read), and each engine gets one ``/metrics`` scrape a second
with vLLM's families (running, waiting, KV usage, token and preemption counters, inter-token
latency). Then ``DetectorTask.tick`` runs ``--ticks`` times, a second of new steps and scrapes
between ticks. Prints the CPU milliseconds of a tick (median and best), and its share of a core
at one tick a second. The sidecar's collector settings are applied (``collector.heap``).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from collector import heap
from collector.detectors.task import DetectorTask
from collector.ingest.hub import hub_for
from collector.model import MetricsScrape
from collector.settings import Settings
from collector.sim.load import EngineLoad, LoadConfig
from collector.sources.recorder import RecorderSource


def main() -> None:
    logging.disable(logging.WARNING)  # the rings join no configured engine: said once per ring
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--seconds", type=int, default=130, help="history before the timed ticks")
    p.add_argument("--ticks", type=int, default=60)
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args()
    t = [1_000_000.0]
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-detectors-") as tmp:
        folder = Path(tmp)
        cfg = LoadConfig(recorder_dir=folder, engines=args.engines, running=args.running)
        loads = [EngineLoad(cfg, i, clock=lambda: t[0]) for i in range(args.engines)]
        settings = Settings(engines=[])
        hub = hub_for(settings, clock=lambda: t[0])
        source = RecorderSource(folder, alive=lambda pid: True, join_wait=0.0, clock=lambda: t[0])
        task = DetectorTask(hub.view, hub.emit, settings.detectors)
        tokens = [0.0] * args.engines

        def second() -> None:
            for _ in range(100):
                t[0] += 0.01
                for load in loads:
                    load.step()
            source.poll(hub)
            for i, name in enumerate(sorted(hub.view.engine_names())[: args.engines]):
                tokens[i] += 2_560.0
                values = {
                    "vllm:num_requests_running": 256.0,
                    "vllm:num_requests_waiting": 4.0,
                    "vllm:kv_cache_usage_perc": 0.6,
                    "vllm:generation_tokens_total": tokens[i],
                    "vllm:prompt_tokens_total": tokens[i] / 4,
                    "vllm:num_preemptions_total": 0.0,
                    "vllm:inter_token_latency_seconds_sum": tokens[i] * 0.02,
                    "vllm:inter_token_latency_seconds_count": tokens[i],
                }
                hub.emit(MetricsScrape(engine=name, ts=t[0], values=values))

        for _ in range(args.seconds):
            second()
        heap.freeze_startup()  # the collector as ``flightrec serve`` sets it
        heap.tune()
        ms = []
        for _ in range(args.ticks):
            second()
            c0 = time.process_time()
            task.tick()
            ms.append((time.process_time() - c0) * 1e3)
        for load in loads:
            load.close()
    print(f"bench_detectors: {args.engines} engines x {args.running} running, {args.seconds} s of history, {args.ticks} ticks")
    print(f"tick                         median {statistics.median(ms):.2f} ms, best {min(ms):.2f} ms")
    print(f"at one tick a second         {statistics.median(ms) / 10:.2f}% of a core")
    if args.json:
        figures = {
            "engines": args.engines,
            "running": args.running,
            "history_s": args.seconds,
            "ticks": args.ticks,
            "tick_ms": {"median": round(statistics.median(ms), 3), "best": round(min(ms), 3)},
        }
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
