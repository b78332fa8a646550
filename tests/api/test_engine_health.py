"""The health verdict of an engine: its state and since when in /api/v1/engines, the HTTP form
for a probe (``GET /api/v1/engines/{name}/health``, no token), ``flightrec health --engine``
against a real server, and the two gauges Prometheus alerts on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from api_context import make_context
from fastapi.testclient import TestClient

from collector.api.app import create_app
from collector.cli import main
from collector.detectors.config import WedgeThresholds
from collector.detectors.wedge_watch import WedgeWatch
from collector.model import HALF_STATS, Event, EventKind, Severity, StepRecord
from collector.settings import EngineConfig

TOKEN = "t0ken-for-the-engine-health-tests"


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def rig(api_url: str) -> Iterator[tuple[Any, WedgeWatch, Clock]]:
    ctx = make_context(
        api_url,
        api_token=TOKEN,
        engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:1"), EngineConfig(name="decode-0/dp1", url="http://127.0.0.1:1")],
    )
    clock = Clock()
    ctx.hub.intake.clock = clock
    ctx.wedges = WedgeWatch(ctx.view, ctx.hub.emit, WedgeThresholds())
    yield ctx, ctx.wedges, clock
    ctx.loop.close()


def _steps(ctx: Any, clock: Clock, n: int, *, start_step: int = 1, held: int = 8) -> None:
    """``n`` steps 0.1 s apart, the watch looking once a second as it does."""
    for i in range(n):
        clock.t += 0.1
        ctx.hub.emit(StepRecord(engine="decode-0", ts=clock.t, step=start_step + i, running=held, waiting=0, halves=HALF_STATS))
        if i % 10 == 9:
            ctx.wedges.tick()
    ctx.wedges.tick()


def _wedge(ctx: Any, clock: Clock, *, start_step: int = 1) -> float:
    _steps(ctx, clock, 50, start_step=start_step)
    last = clock.t
    for _ in range(12):
        clock.t += 1.0
        ctx.wedges.tick()
    return last


def test_the_verdict_follows_the_engine_wedged_then_ok_again(rig: tuple[Any, WedgeWatch, Clock]) -> None:
    ctx, watch, clock = rig
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(ctx)) as client:
        r = client.get("/api/v1/engines/decode-0/health")  # no token: a probe has none
        assert r.status_code == 200 and r.json()["state"] == "starting"  # never answered: not a failure
        _steps(ctx, clock, 50)
        r = client.get("/api/v1/engines/decode-0/health")
        assert r.status_code == 200 and r.json()["state"] == "ok"
        assert set(r.json()) == {"engine", "state", "since", "reason"}
        last = clock.t
        for _ in range(12):
            clock.t += 1.0
            watch.tick()
        r = client.get("/api/v1/engines/decode-0/health")
        assert r.status_code == 503
        body = r.json()
        assert body["engine"] == "decode-0" and body["state"] == "wedged" and body["since"] == pytest.approx(last, abs=0.01)
        assert "8 requests held" in body["reason"]
        items = client.get("/api/v1/engines", headers=auth).json()["items"]
        row = next(e for e in items if e["name"] == "decode-0")
        assert row["state"] == "wedged" and row["state_since"] == pytest.approx(last, abs=0.01) and row["up"] is True
        metrics = client.get("/metrics", headers=auth).text
        assert 'flightrec_engine_wedged{Hostname="node-a",engine="decode-0"} 1.0' in metrics
        assert 'flightrec_engine_wedged{Hostname="node-a",engine="decode-0/dp1"} 0.0' in metrics  # born at 0
        assert 'flightrec_engine_seconds_since_step{Hostname="node-a",engine="decode-0/dp1"} 0.0' in metrics
        since = float(metrics.split('flightrec_engine_seconds_since_step{Hostname="node-a",engine="decode-0"} ')[1].split()[0])
        assert since == pytest.approx(12.0, abs=0.2)
        _steps(ctx, clock, 5, start_step=51)  # it moves again
        r = client.get("/api/v1/engines/decode-0/health")
        assert r.status_code == 200 and r.json()["state"] == "ok"
        assert 'flightrec_engine_wedged{Hostname="node-a",engine="decode-0"} 0.0' in client.get("/metrics", headers=auth).text


def test_down_and_gpu_fault_answer_503_an_unknown_engine_404_a_dp_engine_by_its_name(rig: tuple[Any, WedgeWatch, Clock]) -> None:
    ctx, _, clock = rig
    with TestClient(create_app(ctx)) as client:
        _steps(ctx, clock, 10)
        ctx.hub.emit(
            Event(
                kind=EventKind.XID,
                ts=clock.t,
                source="kmsg",
                message="NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus",
                severity=Severity.CRITICAL,
                engine="decode-0",
                xid=79,
            )
        )
        r = client.get("/api/v1/engines/decode-0/health")
        assert r.status_code == 503 and r.json()["state"] == "gpu_fault"
        ctx.hub.emit(Event(kind=EventKind.ENGINE_DOWN, ts=clock.t, source="scrape", message="down", severity=Severity.CRITICAL, engine="decode-0"))
        assert client.get("/api/v1/engines/decode-0/health").json()["state"] == "down"
        assert client.get("/api/v1/engines/nope/health").status_code == 404
        r = client.get("/api/v1/engines/decode-0/dp1/health")
        assert r.status_code == 200 and r.json()["engine"] == "decode-0/dp1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_flightrec_health_engine_exits_non_zero_while_the_engine_is_wedged(
    rig: tuple[Any, WedgeWatch, Clock], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, watch, clock = rig
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        config = tmp_path / "flightrec.yaml"
        config.write_text(f"host: 127.0.0.1\nport: {port}\n")
        _steps(ctx, clock, 50)
        assert main(["health", "--config", str(config), "--engine", "decode-0"]) == 0
        assert capsys.readouterr().out.startswith("engine decode-0: ok since ")
        _wedge(ctx, clock, start_step=51)
        assert main(["health", "--config", str(config), "--engine", "decode-0"]) == 1
        out = capsys.readouterr().out
        assert out.startswith("engine decode-0: wedged since ") and "requests held and no step" in out
        assert main(["health", "--config", str(config), "--engine", "nope"]) == 2
        assert "no engine named 'nope'" in capsys.readouterr().err
        _steps(ctx, clock, 5, start_step=101)
        assert main(["health", "--config", str(config), "--engine", "decode-0"]) == 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
