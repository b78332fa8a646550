"""The dcgm-exporter source end to end: a loopback HTTP server serves the page captured from a
GPU Operator's dcgm-exporter; the source scrapes it into the real hub; the sidecar's own /metrics
then carries dcgm-exporter's labels for that GPU (gpu, UUID, pci_bus_id, modelName), so panels
and alerts join on them. A failing exporter is a down source, never zero samples. With
gpu_metrics: dcgm, NVML polls nothing and only listens for Xid events."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.api.metrics import sidecar_registry
from collector.model import GpuSample
from collector.settings import load_settings
from collector.sources.dcgm import DcgmSource
from collector.sources.registry import BUILDERS
from tests.api.api_context import make_context

PAGE = (Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter" / "l4-gpu-operator.txt").read_bytes()


@pytest.fixture
def exporter() -> Iterator[dict[str, object]]:
    state: dict[str, object] = {"status": 200, "body": PAGE, "hits": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            state["hits"] = int(state["hits"]) + 1  # type: ignore[call-overload]
            body = state["body"] if self.path == "/metrics" else b"not found\n"
            status = int(state["status"]) if self.path == "/metrics" else 404  # type: ignore[call-overload]
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))  # type: ignore[arg-type]
            self.end_headers()
            self.wfile.write(body)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        yield state
    finally:
        server.shutdown()


def test_gauges_from_the_exporter_carry_its_labels_on_the_sidecars_metrics(exporter: dict[str, object], tmp_path: Path) -> None:
    ctx = make_context(f"sqlite:///{tmp_path / 'm.db'}")
    src = DcgmSource(str(exporter["url"]), interval=0.05)

    async def main() -> None:
        task = asyncio.create_task(src.run(ctx.hub))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if src.scrapes >= 3:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert src.status().up and src.status().details["gpus"] == 1
    text = generate_latest(sidecar_registry(ctx)).decode()
    temp = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "flightrec_gpu_temperature_celsius"]
    [sample] = temp
    # exactly the labels dcgm-exporter gave this GPU, so `on (gpu, UUID, pci_bus_id)` joins
    assert sample.labels["gpu"] == "0" and sample.labels["UUID"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert sample.labels["pci_bus_id"] == "00000000:31:00.0" and sample.labels["modelName"] == "NVIDIA L4"
    assert sample.value == 31
    power = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "flightrec_gpu_power_watts"]
    assert power[0].value == pytest.approx(16.365)


def test_a_failing_exporter_is_a_down_source_and_no_samples(exporter: dict[str, object]) -> None:
    got: list[object] = []

    class Sink:
        def emit(self, item: object) -> None:
            got.append(item)

    src = DcgmSource(str(exporter["url"]), interval=0.05)

    async def once() -> None:
        import httpx

        async with httpx.AsyncClient(timeout=2) as client:
            await src.scrape_once(client, Sink())

    exporter["status"] = 503
    asyncio.run(once())
    assert got == [] and not src.status().up and "HTTP 503" in src.status().reason
    exporter["status"], exporter["body"] = 200, PAGE[: len(PAGE) // 2]  # a page cut mid-line
    asyncio.run(once())
    assert got == [] and "truncated" in src.status().reason
    exporter["body"] = b"# nothing from DCGM\n"
    asyncio.run(once())
    assert got == [] and "no DCGM_FI_DEV_" in src.status().reason
    exporter["body"] = PAGE
    asyncio.run(once())
    assert [type(g) for g in got] == [GpuSample] and src.status().up
    # nobody listening: a connection error, the same way
    src.url = "http://127.0.0.1:9/metrics"
    asyncio.run(once())
    assert not src.status().up and "ConnectError" in src.status().reason


def test_the_setting_selects_the_source_and_nvml_keeps_only_xid_events() -> None:
    table = BUILDERS
    nvml_mode = load_settings(nvml="auto")
    assert table["dcgm"](nvml_mode) == [] and table["nvml"](nvml_mode)[0].gauges is True
    dcgm_mode = load_settings(gpu_metrics="dcgm", dcgm_url="http://127.0.0.1:9400/metrics")
    [dcgm] = table["dcgm"](dcgm_mode)
    assert isinstance(dcgm, DcgmSource) and dcgm.url == "http://127.0.0.1:9400/metrics"
    [nvml] = table["nvml"](dcgm_mode)
    assert nvml.gauges is False and nvml.xid_events is True
    assert table["nvml"](load_settings(gpu_metrics="dcgm", xid_events=False)) == []


def test_nvml_without_gauges_polls_nothing() -> None:
    from collector.sources.nvml import NvmlSource
    from tests.sources.test_nvml import two_gpus

    backend = two_gpus()
    src = NvmlSource(backend, interval=0.01, event_timeout_ms=100, gauges=False)
    polled: list[int] = []
    src.poll_once = lambda: polled.append(1) or []  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(src.run(type("S", (), {"emit": lambda self, i: None})()))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    t0 = time.monotonic()
    asyncio.run(main())
    assert polled == [] and time.monotonic() - t0 < 5
    assert len(src.gpus) == 2  # NVML was initialised: its handles register the Xid events
