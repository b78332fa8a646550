"""Fault -> alert visible in a real Alertmanager's API (GET /api/v2/alerts): p50 and p99.

Two modes:

``--mode client``   our AlertmanagerClient alone: ``fire(alert)`` -> visible in Alertmanager.
``--mode sidecar``  the whole path through a real ``flightrec serve`` process: the bench writes
                    Xid lines to a kernel-log file the sidecar follows (``kmsg: <file>``) and
                    CUDA error lines to an engine log file (``engines[].log``), then polls
                    Alertmanager until the alert of that fault shows.

Each fault is told apart by a label or annotation of its own: Xid faults use a distinct PCI
bus id (a new ``gpu`` label, so a new alert); CUDA faults carry a token in the error message
that Alertmanager shows in the alert's description once the sidecar sends it.

Alertmanager: a throwaway one on loopback (``prometheus-alertmanager`` or ``alertmanager`` on
PATH), or ``--alertmanager URL``. Prints the figures; ``--markdown`` prints a table row too.

    python bench/bench_alert_latency.py --mode client --faults 100
    python bench/bench_alert_latency.py --mode sidecar --faults 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from collector.alerting.alertmanager import AlertmanagerClient
from collector.alerting.alerts import Alert
from collector.model import Severity
from tests.support.alertmanager import LocalAlertmanager, WebhookReceiver, free_port

POLL_S = 0.002


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Watcher:
    """Polls GET /api/v2/alerts in a thread and stamps when each awaited match first shows."""

    def __init__(self, am_url: str) -> None:
        self.url = am_url.rstrip("/") + "/api/v2/alerts"
        self._client = httpx.Client(timeout=2.0)

    def wait(self, match: Callable[[dict], bool], timeout: float = 10.0) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                alerts = self._client.get(self.url).json()
            except httpx.HTTPError:
                alerts = []
            if any(match(a) for a in alerts):
                return time.time()
            time.sleep(POLL_S)
        return None

    def close(self) -> None:
        self._client.close()


def run_client_mode(am_url: str, faults: int, gap: float) -> list[float]:
    watcher = Watcher(am_url)
    latencies: list[float] = []

    async def main() -> None:
        client = AlertmanagerClient([am_url])
        task = asyncio.create_task(client.run())
        try:
            for i in range(faults):
                gpu = f"0000:{i % 256:02x}:{i // 256:02x}.0"
                seen: list[float | None] = []
                waiter = threading.Thread(
                    target=lambda: seen.append(watcher.wait(lambda a: a["labels"].get("gpu") == gpu and a["labels"].get("bench") == "client"))
                )
                waiter.start()
                t0 = time.time()
                client.fire(
                    Alert(
                        name="GpuXidError",
                        severity=Severity.CRITICAL,
                        labels={"gpu": gpu, "xid": "43", "host": "bench", "bench": "client"},
                        annotations={"summary": f"bench fault {i}"},
                        starts_at=t0,
                    )
                )
                await asyncio.to_thread(waiter.join)
                if seen[0] is not None:
                    latencies.append(seen[0] - t0)
                await asyncio.sleep(gap)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()

    asyncio.run(main())
    watcher.close()
    return latencies


SIDECAR_CONFIG = """\
engines:
  - name: bench-0
    url: http://127.0.0.1:{engine_port}
    log: {engine_log}
database: sqlite:///{db}
alertmanager: [{am_url}]
kmsg: {kmsg}
nvml: "off"
recorder: "off"
port: {port}
public_url: http://127.0.0.1:{port}
"""

CUDA_LINE = (
    "(Worker_TP0 pid=3107) ERROR {stamp} [multiproc_executor.py:1063] "
    "torch.AcceleratorError: CUDA error: unspecified launch failure (bench {token})\n"
)
XID_LINE = "[{uptime:.6f}] NVRM: Xid (PCI:0000:{bus:02x}:00): 31, pid=444, name=python3, channel 0x0000000a\n"


def run_sidecar_mode(am_url: str, faults: int, gap: float, startup: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"xid": [], "cuda": []}
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-") as tmp:
        root = Path(tmp)
        kmsg, engine_log = root / "kern.log", root / "engine.log"
        kmsg.touch()
        engine_log.touch()
        port = free_port()
        config = root / "flightrec.yml"
        config.write_text(
            SIDECAR_CONFIG.format(engine_port=free_port(), engine_log=engine_log, db=root / "fr.db", am_url=am_url, kmsg=kmsg, port=port)
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from collector.cli import main; sys.exit(main())", "serve", "--config", str(config)],
            cwd=tmp,
            stdout=open(root / "serve.log", "w"),
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")},
        )
        watcher = Watcher(am_url)
        try:
            deadline = time.monotonic() + startup
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code < 500:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            else:
                raise SystemExit("flightrec serve did not answer /healthz:\n" + (root / "serve.log").read_text()[-3000:])
            time.sleep(1.0)  # let the followers reach the end of the files
            for i in range(faults):
                if i % 2 == 0:
                    bus = 1 + (i // 2) % 250
                    line = XID_LINE.format(uptime=time.monotonic(), bus=bus)

                    def match(a: dict, bus: int = bus) -> bool:
                        # dcgm-exporter's labels: the bus id is pci_bus_id (gpu is the index),
                        # in NVML's upper-case hex (00000000:0A:00.0)
                        return a["labels"].get("alertname") == "GpuXidError" and f":{bus:02x}:00" in a["labels"].get("pci_bus_id", "").lower()

                    kind, target = "xid", kmsg
                else:
                    token = f"f{i}-{time.time_ns()}"
                    line = CUDA_LINE.format(stamp=time.strftime("%m-%d %H:%M:%S"), token=token)

                    def match(a: dict, token: str = token) -> bool:
                        return token in a.get("annotations", {}).get("description", "") + a.get("annotations", {}).get("summary", "")

                    kind, target = "cuda", engine_log
                t0 = time.time()
                with open(target, "a") as fh:
                    fh.write(line)
                    fh.flush()
                seen = watcher.wait(match, timeout=10.0)
                if seen is None:
                    print(f"fault {i} ({kind}): no alert within 10 s", file=sys.stderr)
                else:
                    out[kind].append(seen - t0)
                time.sleep(gap)
        finally:
            watcher.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return out


def report(label: str, latencies: list[float], faults: int, markdown: bool, into: dict[str, Any] | None = None) -> None:
    if not latencies:
        print(f"{label}: no alert seen out of {faults} faults")
        if into is not None:
            into[label] = {"faults": faults, "seen": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
        return
    ms = [x * 1000 for x in latencies]
    p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
    if into is not None:
        into[label] = {"faults": faults, "seen": len(ms), "p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "max_ms": round(max(ms), 1)}
    print(f"{label}: {len(ms)}/{faults} faults seen; p50 {p50:.1f} ms, p99 {p99:.1f} ms, mean {statistics.fmean(ms):.1f} ms, max {max(ms):.1f} ms")
    if markdown:
        print(f"| {label} | {len(ms)} | {p50:.1f} | {p99:.1f} | {max(ms):.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["client", "sidecar"], default="client")
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between faults")
    parser.add_argument("--alertmanager", help="use this Alertmanager instead of starting one")
    parser.add_argument("--startup", type=float, default=60.0, help="sidecar mode: seconds to wait for it")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    figures: dict[str, Any] = {"mode": args.mode, "faults": args.faults}
    if args.faults < 50:
        print("note: p99 needs at least 50 faults to mean anything", file=sys.stderr)

    receiver = am = None
    am_url = args.alertmanager
    if am_url is None:
        receiver = WebhookReceiver().start()
        am = LocalAlertmanager(receiver.url, port=free_port()).start()
        am_url = am.url
    try:
        if args.mode == "client":
            report("client fire -> Alertmanager API", run_client_mode(am_url, args.faults, args.gap), args.faults, args.markdown, figures)
        else:
            result = run_sidecar_mode(am_url, args.faults, args.gap, args.startup)
            report("Xid line -> Alertmanager API", result["xid"], (args.faults + 1) // 2, args.markdown, figures)
            report("CUDA error line -> Alertmanager API", result["cuda"], args.faults // 2, args.markdown, figures)
            report("all faults", result["xid"] + result["cuda"], args.faults, args.markdown, figures)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        if am is not None:
            am.close()
        if receiver is not None:
            receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
