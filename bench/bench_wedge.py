"""A wedged engine on the simulator: time from its last step to the ``engine_wedged`` event, to
the committed snapshot, to the ``VllmEngineWedged`` page received by an Alertmanager stand-in,
and from the step after the wedge to the page's resolution and the state back to ok.

Each round runs the sidecar in this process (``collector.service.Service``, default wedge
settings unless told) against a fresh simulated P/D pair in hang mode (``flightrec demo --hang``'s
pair): the ramp runs to the fault point, the decode engine's next step never ends for
``--hang-for`` seconds, then it moves again. The last step is the simulator's own stamp (taken
right after the decode engine's last step); the event's and the snapshot's times are the
sidecar's (the trigger's ``ts``, the commit callback); the page's is when a loopback HTTP server
standing in for Alertmanager's ``POST /api/v2/alerts`` received it (the sidecar's own path: a
real Alertmanager adds its group_wait before any notification).

    .venv/bin/python bench/bench_wedge.py [--rounds 3] [--hang-for 20] [--floor 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.detectors.config import DetectorThresholds, WedgeThresholds  # noqa: E402
from collector.model import EventKind  # noqa: E402
from collector.settings import Settings  # noqa: E402


class AlertSink:
    """Alertmanager's v2 POST, stamped: (received at, alert) for each alert in each post."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, Any]]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                now = time.time()
                try:
                    alerts = json.loads(body or b"[]")
                except ValueError:
                    alerts = []
                sink.received += [(now, a) for a in alerts if isinstance(a, dict)]
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def first(self, name: str, *, resolved: bool, since: float) -> float | None:
        for ts, a in self.received:
            labels = a.get("labels") or {}
            ends = a.get("endsAt")
            # a firing alert's endsAt lies ahead (its resend horizon); a resolved one's is its end
            is_resolved = isinstance(ends, str) and datetime.fromisoformat(ends).timestamp() <= ts + 1.0
            if ts >= since and labels.get("alertname") == name and labels.get("engine") == "decode-0" and is_resolved == resolved:
                return ts
        return None

    def close(self) -> None:
        self.server.shutdown()


async def one_round(hang_for: float, thr: WedgeThresholds) -> dict[str, Any]:
    from collector.service import Service
    from collector.sim.pair import PairConfig, SimPair
    from collector.sources.nvml import NvmlSource

    work = Path(tempfile.mkdtemp(prefix="bench-wedge-"))
    sink = AlertSink()
    pair = SimPair(PairConfig(workdir=work, recorder_dir=work / "recorder", hang_s=hang_for))
    await pair.start()
    settings = Settings(
        engines=pair.engine_configs(),
        recorder_dir=work / "recorder",
        kmsg=str(pair.kmsg_path),
        nvml="off",
        database=f"sqlite:///{work / 'flightrec.db'}",
        spool_dir=work / "spool",
        port=0,
        alertmanager=[sink.url],
        detectors=DetectorThresholds(wedge=thr),
    )
    svc = Service(settings, extra_sources=[NvmlSource(pair.nvml, interval=0.5)])
    got: dict[str, float] = {}

    def on_snapshot(doc: Any, trigger: Any) -> None:
        if doc.engine == "decode-0" and trigger.kind is EventKind.ENGINE_WEDGED and "commit" not in got:
            got["commit"], got["event"] = time.time(), trigger.ts

    svc.on_snapshot.append(on_snapshot)
    service = asyncio.create_task(svc.run())
    await svc.started.wait()
    sim = asyncio.create_task(pair.run())
    ok_again: float | None = None
    deadline = time.monotonic() + 120 + hang_for
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        if pair.resumed_at is not None and svc.ctx is not None:
            verdict = svc.ctx.engine_health("decode-0")
            if verdict is not None and verdict["state"] == "ok":
                ok_again = time.time()
                break
    await asyncio.sleep(1.5)  # the resolution's send
    svc.request_stop()
    await service
    sim.cancel()
    await asyncio.gather(sim, return_exceptions=True)
    await pair.close()
    sink.close()
    last = pair.wedged_at
    page = sink.first("VllmEngineWedged", resolved=False, since=last or 0.0)
    resolved = sink.first("VllmEngineWedged", resolved=True, since=pair.resumed_at or 0.0)

    def after(ts: float | None, base: float | None) -> float | None:
        return None if ts is None or base is None else round(ts - base, 3)

    return {
        "last_step_to_event_s": after(got.get("event"), last),
        "last_step_to_snapshot_s": after(got.get("commit"), last),
        "last_step_to_page_s": after(page, last),
        "resume_to_state_ok_s": after(ok_again, pair.resumed_at),
        "resume_to_page_resolved_s": after(resolved, pair.resumed_at),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hang-for", type=float, default=20.0, help="seconds the decode engine's step lasts")
    ap.add_argument("--floor", type=float, help="detectors.wedge.floor_s (default: the setting's default)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    thr = WedgeThresholds() if args.floor is None else WedgeThresholds(floor_s=args.floor)
    rounds = [asyncio.run(one_round(args.hang_for, thr)) for _ in range(args.rounds)]
    keys = list(rounds[0])
    summary = {}
    for k in keys:
        values = [r[k] for r in rounds if r[k] is not None]
        summary[k] = {
            "median": round(statistics.median(values), 3) if values else None,
            "max": max(values) if values else None,
            "missing": len(rounds) - len(values),
        }
    out = {"rounds": rounds, "summary": summary, "floor_s": thr.floor_s, "hang_for_s": args.hang_for, "load": os.getloadavg(), "cpus": os.cpu_count()}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wedge on the simulator: {args.rounds} rounds, floor {thr.floor_s:g} s, hang {args.hang_for:g} s, load {out['load'][0]:.2f}")
    for k, v in summary.items():
        print(f"  {k:28s} median {v['median']} s, max {v['max']} s" + (f" ({v['missing']} missing)" if v["missing"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
