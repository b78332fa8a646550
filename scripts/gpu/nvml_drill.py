#!/usr/bin/env python3
"""Drill the GPU sources on a real NVIDIA GPU: samples, call costs, and planted faults.

Runs the sidecar's own NvmlSource (real PynvmlBackend) and KmsgSource (/dev/kmsg) for a
few seconds, prints samples and per-call timings, then plants faults in child processes
of its own (never in anyone else's, never touching the card's settings):

- ``trap``: a kernel executing the PTX ``trap`` instruction (expected Xid 43);
- ``oob``: a kernel storing to address 0x10 (expected Xid 31);
- ``torch_index``: a PyTorch out-of-range index, a device-side assert (expected Xid 43).

For each fault it reports the time from the launch to the NVML Xid event, to the kernel
log line, and to the faulting process's own error, and whether XidMerger folded the two
reports into one event. Writes everything as JSON (``--out``).

Needs: nvidia-ml-py, CuPy (for trap/oob; skipped without it), PyTorch (torch_index),
pydantic (the sources' settings models), root for /dev/kmsg (reported, not required).

    python3 scripts/gpu/nvml_drill.py --out drill.json [--sample-seconds 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from collector.model import Event, GpuSample  # noqa: E402
from collector.sources.base import SourceError  # noqa: E402
from collector.sources.kmsg import KmsgSource  # noqa: E402
from collector.sources.nvml import READINGS, NvmlSource  # noqa: E402
from collector.sources.nvml_backend import NvmlError, PynvmlBackend  # noqa: E402
from collector.xid.merge import XidMerger  # noqa: E402

CHILD_CUPY = r"""
import json, os, sys, time
import cupy as cp
kind = sys.argv[1]
src = {
    "trap": 'extern "C" __global__ void k(int* p) { asm volatile("trap;"); }',
    "oob": 'extern "C" __global__ void k(int* p) { *((volatile int*)0x10) = 1; }',
}[kind]
k = cp.RawModule(code=src).get_function("k")
buf = cp.zeros(4, dtype=cp.int32)
cp.cuda.Device().synchronize()
print(json.dumps({"launch": time.time()}), flush=True)
try:
    k((1,), (1,), (buf,))
    cp.cuda.Device().synchronize()
    print(json.dumps({"t": time.time(), "error": None}), flush=True)
except Exception as exc:
    print(json.dumps({"t": time.time(), "error": f"{type(exc).__name__}: {exc}"}), flush=True)
os._exit(0)  # skip CuPy's teardown, which reports the same error again
"""

CHILD_TORCH = r"""
import json, os, time
import torch
x = torch.zeros(4, device="cuda")
idx = torch.tensor([10], device="cuda")
torch.cuda.synchronize()
print(json.dumps({"launch": time.time()}), flush=True)
try:
    y = x[idx]
    torch.cuda.synchronize()
    print(json.dumps({"t": time.time(), "error": None}), flush=True)
except Exception as exc:
    print(json.dumps({"t": time.time(), "error": f"{type(exc).__name__}: {exc}"}), flush=True)
os._exit(0)
"""

EXPECTED = {"trap": 43, "oob": 31, "torch_index": 43}


class Collector:
    """The drill's sink: every observation with its arrival time, Xids through the merger."""

    def __init__(self) -> None:
        self.samples: list[GpuSample] = []
        self.events: list[tuple[float, Event]] = []
        self.merger = XidMerger(2.0)
        self.published: list[Event] = []

    def emit(self, item: object) -> None:
        now = time.time()
        if isinstance(item, GpuSample):
            self.samples.append(item)
        elif isinstance(item, Event):
            self.events.append((now, item))
            merged, is_new = self.merger.offer(item)
            if is_new:
                self.published.append(merged)
            print(
                f"  event  {item.source:5s} {item.kind.value:8s} xid={item.xid} gpu={item.gpu} pid={item.pid} new={is_new} :: {item.message[:110]}",
                flush=True,
            )


def call_costs(backend: PynvmlBackend, n: int) -> dict[str, dict[str, float]]:
    """Each reading of our backend on GPU 0, n times: median and max microseconds."""
    h = backend.handle(0)
    out: dict[str, dict[str, float]] = {}
    for reading in READINGS:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                getattr(backend, reading)(h)
            except NvmlError as exc:
                out[reading] = {"error": str(exc)}  # type: ignore[dict-item]
                break
            times.append((time.perf_counter() - t0) * 1e6)
        else:
            out[reading] = {"median_us": round(statistics.median(times), 1), "max_us": round(max(times), 1), "n": n}
    return out


async def plant(kind: str, collector: Collector, settle_s: float) -> dict[str, Any]:
    code = CHILD_TORCH if kind == "torch_index" else CHILD_CUPY
    args = ["-c", code] + ([] if kind == "torch_index" else [kind])
    seen_before = len(collector.events)
    proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    await asyncio.sleep(settle_s)  # let both witnesses arrive
    lines = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
    launch = next((x["launch"] for x in lines if "launch" in x), None)
    result = next((x for x in lines if "error" in x), None)
    new_events = collector.events[seen_before:]
    nvml = [(t, e) for t, e in new_events if e.source == "nvml" and e.xid is not None]
    kmsg = [(t, e) for t, e in new_events if e.source == "kmsg" and e.pid == proc.pid]

    def ms(t: float | None) -> float | None:
        return None if t is None or launch is None else round((t - launch) * 1000, 1)

    first_nvml = nvml[0] if nvml else None
    first_kmsg = kmsg[0] if kmsg else None
    # The merger folds a second witness into the first event in place: find that one.
    firsts = [x[1] for x in (first_nvml, first_kmsg) if x is not None]
    merged = next((p for p in collector.published if any(p is f for f in firsts)), None)
    return {
        "kind": kind,
        "pid": proc.pid,
        "rc": proc.returncode,
        "expected_xid": EXPECTED[kind],
        "nvml_xids": [e.xid for _, e in nvml],
        "kmsg_xids": [e.xid for _, e in kmsg],
        "launch_to_nvml_ms": ms(first_nvml[0] if first_nvml else None),
        "launch_to_kmsg_ms": ms(first_kmsg[0] if first_kmsg else None),
        "launch_to_process_error_ms": ms(result["t"] if result else None),
        "process_error": result["error"] if result else None,
        "kmsg_line": first_kmsg[1].message if first_kmsg else None,
        "merged_sources": list(merged.sources) if merged else None,
        "merged_into_one": bool(merged and {"nvml", "kmsg"} <= set(merged.sources)),
        "stderr_tail": err.decode(errors="replace")[-600:],
    }


async def drill(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "started": time.time(),
        "host": {"kernel": platform.release(), "python": platform.python_version(), "machine": platform.machine()},
    }
    try:
        import pynvml

        report["host"]["nvidia_ml_py"] = getattr(pynvml, "__version__", None)
    except ImportError:
        pass
    collector = Collector()
    backend = PynvmlBackend()
    source = NvmlSource(backend, interval=args.interval, pcie_interval=args.pcie_interval, event_timeout_ms=args.event_timeout_ms)
    t0 = time.perf_counter()
    try:
        source.start()
    except SourceError as exc:  # NvmlUnavailable included: nothing to drill here
        report["error"] = f"NVML: {exc}"
        return report
    report["nvml_start_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    report["driver"] = source.driver
    try:
        report["nvml_version"] = backend._m.nvmlSystemGetNVMLVersion()
    except Exception as exc:  # noqa: BLE001 - a report field, not a failure
        report["nvml_version"] = f"unavailable: {exc}"
    report["gpus"] = [{"index": g.index, "uuid": g.uuid, "bus_id": g.bus_id, "name": g.name} for g in source.gpus]
    report["backend_call_costs_us"] = call_costs(backend, args.calls)
    source.stop()  # run() starts it again, as the sidecar does
    print("GPUs:", report["gpus"], "\ncall costs (us):", json.dumps(report["backend_call_costs_us"]), flush=True)

    kmsg = KmsgSource(args.kmsg, mode="path", poll_interval=0.25)
    tasks = [asyncio.create_task(source.run(collector), name="nvml")]
    kmsg_error = None
    try:
        os.close(os.open(args.kmsg, os.O_RDONLY | os.O_NONBLOCK))
        tasks.append(asyncio.create_task(kmsg.run(collector), name="kmsg"))
    except OSError as exc:
        kmsg_error = str(exc)
    report["kmsg_readable"] = kmsg_error is None
    report["kmsg_error"] = kmsg_error

    print(f"sampling for {args.sample_seconds}s ...", flush=True)
    await asyncio.sleep(args.sample_seconds)
    for s in collector.samples[-len(source.gpus) :]:
        print("  sample", json.dumps(s.to_dict()), flush=True)
    report["samples_before"] = [s.to_dict() for s in collector.samples]

    faults = []
    kinds = []
    for _ in range(args.repeat):
        kinds += ["trap", "oob"]
    if args.torch:
        kinds.append("torch_index")
    for kind in kinds:
        print(f"planting {kind} ...", flush=True)
        try:
            result = await plant(kind, collector, args.settle_seconds)
        except (OSError, SourceError) as exc:
            result = {"kind": kind, "error": str(exc)}
        print("  ", json.dumps({k: v for k, v in result.items() if k != "stderr_tail"}), flush=True)
        faults.append(result)
    report["faults"] = faults

    n_before = len(collector.samples)
    await asyncio.sleep(max(2 * args.interval, 1.0))
    after = collector.samples[n_before:]
    report["samples_after"] = [s.to_dict() for s in after]
    report["gpu_healthy_after"] = bool(after) and not any(g.lost for g in source.gpus)
    for t in tasks:
        t.cancel()
    for t in tasks:
        try:
            await t
        except (asyncio.CancelledError, SourceError) as exc:
            if isinstance(exc, SourceError):
                report.setdefault("source_errors", []).append(f"{t.get_name()}: {exc}")
    report["source_call_timings_us"] = {
        k: {"count": v.count, "mean_us": round(v.mean_us, 1), "max_us": round(v.max_s * 1e6, 1)} for k, v in source.timings.items()
    }
    report["unsupported"] = {g.index: sorted(g.unsupported) for g in source.gpus}
    report["event_thread_error"] = source.event_thread_error
    report["kmsg_stats"] = {"lines": kmsg.lines_read, "parse_errors": kmsg.parse_errors, "records_lost": kmsg.records_lost, "uuids": kmsg.uuids}
    report["events"] = [{"arrived": t, **e.to_dict()} for t, e in collector.events]
    report["published"] = [e.to_dict() for e in collector.published]
    report["summary"] = summarise(faults)
    return report


def summarise(faults: list[dict[str, Any]]) -> dict[str, Any]:
    def vals(key: str) -> list[float]:
        return [f[key] for f in faults if isinstance(f.get(key), (int, float))]

    out: dict[str, Any] = {"faults": len(faults), "merged_into_one": sum(bool(f.get("merged_into_one")) for f in faults)}
    for key in ("launch_to_nvml_ms", "launch_to_kmsg_ms", "launch_to_process_error_ms"):
        v = vals(key)
        out[key] = {"min": min(v), "median": round(statistics.median(v), 1), "max": max(v)} if v else None
    gaps = [
        abs(f["launch_to_nvml_ms"] - f["launch_to_kmsg_ms"])
        for f in faults
        if isinstance(f.get("launch_to_nvml_ms"), float) and isinstance(f.get("launch_to_kmsg_ms"), float)
    ]
    out["nvml_kmsg_gap_ms"] = {"min": round(min(gaps), 1), "median": round(statistics.median(gaps), 1), "max": round(max(gaps), 1)} if gaps else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sample-seconds", type=float, default=5.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--pcie-interval", type=float, default=30.0)
    p.add_argument("--event-timeout-ms", type=int, default=1000)
    p.add_argument("--calls", type=int, default=50, help="repetitions per reading for the call costs")
    p.add_argument("--repeat", type=int, default=3, help="trap and oob faults each, this many times")
    p.add_argument("--settle-seconds", type=float, default=2.0)
    p.add_argument("--no-torch", dest="torch", action="store_false")
    p.add_argument("--kmsg", default="/dev/kmsg", help="kernel log to follow (a file is followed like tail -F)")
    args = p.parse_args()
    report = asyncio.run(drill(args))
    args.out.write_text(json.dumps(report, indent=1, default=str))
    if "error" in report:
        print(report["error"], file=sys.stderr)
        return 2
    print("summary:", json.dumps(report["summary"], indent=1), flush=True)
    print("wrote", args.out, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
