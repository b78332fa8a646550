"""Internal: ``flightrec simulate``: a node-sized load of simulated vLLM engines, for sizing the sidecar.

    flightrec simulate --engines 8 --running 256 --steps-per-second 100 --duration 120 \\
        --recorder-dir /dev/shm/flightrec --write-config sidecar.yaml --serve-metrics
    flightrec serve --config sidecar.yaml

The engines write their steps into ``--recorder-dir`` through the recorder channel
(``collector.sim.load``); ``--write-config`` gets the sidecar settings that watch them (with
each engine's ``/metrics`` URL when ``--serve-metrics`` serves vLLM's families on one port per
engine). It runs for ``--duration`` seconds or until interrupted, then prints what it achieved
and its own CPU; ``--summary-json FILE`` writes the same figures for scripts.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from collector.sim.load import EngineLoad, LoadConfig, RunReport, config_document, run, summary_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engines", type=int, default=1, help="simulated engines (default 1)")
    p.add_argument("--running", type=int, default=256, help="running requests per engine step (default 256)")
    p.add_argument("--steps-per-second", type=float, default=100.0, help="steps per second per engine (default 100)")
    p.add_argument("--duration", type=float, help="seconds to run (default: until interrupted)")
    p.add_argument("--recorder-dir", required=True, help="folder for the ring files (the sidecar's recorder_dir)")
    p.add_argument("--write-config", help="write the sidecar settings (YAML) naming the engines to this file")
    p.add_argument("--serve-metrics", action="store_true", help="serve /metrics and /health, one port per engine")
    p.add_argument("--metrics-port", type=int, default=0, help="first port for --serve-metrics (default: free ports)")
    p.add_argument("--engine-name", help="engine name base, as FLIGHTREC_ENGINE_NAME (default vllm-<pid>)")
    p.add_argument("--isl", type=int, default=1024, help="mean prompt tokens (default 1024)")
    p.add_argument("--osl", type=int, default=256, help="mean output tokens (default 256)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the simulated requests (default 0)")
    p.add_argument("--no-workload-records", action="store_true", help="omit the workload records (for older sidecars)")
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds between writing the config and the first step")
    p.add_argument("--linger", action="store_true", help="after --duration, stay up idle (rings, /metrics) until interrupted")
    p.add_argument("--summary-json", help="write the final figures as JSON to this file")
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines (0: none)")


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    for name in ("engines", "running"):
        if getattr(args, name) < 1:
            raise SystemExit(f"flightrec simulate: --{name} must be at least 1")
    if args.steps_per_second <= 0:
        raise SystemExit("flightrec simulate: --steps-per-second must be positive")
    return LoadConfig(
        recorder_dir=Path(args.recorder_dir).resolve(),
        engines=args.engines,
        running=args.running,
        steps_per_second=args.steps_per_second,
        duration=args.duration,
        isl=args.isl,
        osl=args.osl,
        name=args.engine_name,
        seed=args.seed,
        workload_records=not args.no_workload_records,
    )


def _write_config(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)  # a reader waiting for the file never sees half of it


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    servers = None
    ports: list[int | None] = [None] * cfg.engines
    if args.serve_metrics:
        from collector.sim.load_http import MetricsServers

        servers = MetricsServers(cfg.engines, first_port=args.metrics_port)
        ports = list(servers.ports())
    engines = [EngineLoad(cfg, i, port=ports[i]) for i in range(cfg.engines)]
    urls = servers.attach(engines) if servers is not None else {}
    if args.write_config:
        doc = config_document(cfg, engines, urls)
        if not urls:
            # No URL, no engine entry (settings need one): the sidecar still reads the rings
            # and lists these engines as recorder-only.
            doc["engines"] = []
        _write_config(Path(args.write_config), doc)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    names = ", ".join(e.name for e in engines[:4]) + (", ..." if cfg.engines > 4 else "")
    print(
        f"flightrec simulate: {cfg.engines} engine(s) [{names}] x {cfg.running} running x {cfg.steps_per_second:g} steps/s into {cfg.recorder_dir}",
        flush=True,
    )
    for name, url in list(urls.items())[:4]:
        print(f"  {name}: {url}/metrics", flush=True)

    def progress(r: RunReport) -> None:
        print(f"  {r.wall_s:6.1f} s: {r.steps_per_s:7.1f} steps/s, {r.rows_per_s:9.0f} rows/s, CPU {100 * r.cpu_share:4.1f}%", flush=True)

    try:
        if args.start_delay > 0:  # a sidecar started on the config reads the rings from step 1
            stop.wait(args.start_delay)
        report = run(engines, cfg, stop, progress if args.progress_every > 0 else None, args.progress_every or 10.0)
        for line in report.lines():
            print(line, flush=True)
        if args.summary_json:
            Path(args.summary_json).write_text(summary_json(report) + "\n")
        if args.linger:  # idle engines, not dead ones: a benchmark reads the sidecar's counters now
            stop.wait()
    finally:
        if servers is not None:
            servers.close()
        for e in engines:
            e.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="flightrec simulate")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
