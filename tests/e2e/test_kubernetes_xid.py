"""An Xid finds its engine in Kubernetes, end to end with a real `flightrec serve` in its
DaemonSet configuration: discovery finds two vLLM pods through a stand-in API server (loopback
HTTP), the kubelet's PodResources API is a real gRPC server on a Unix socket speaking the
kubelet's api.proto (it gives one pod the node's GPU), the GPU gauges come from a loopback
dcgm-exporter serving a captured GPU Operator page, and the kernel log is a file. An Xid on that
GPU (its pid in no pod this machine has) becomes a snapshot of the pod holding the GPU alone, and
the incident page's data names that pod and container."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_discovery_serve import Background, free_port, get
from tests.sources.kubeapi_fake import RecordedApi
from tests.sources.test_discovery import PODS, on_loopback, vllm_stub
from tests.support.sidecar import serve

grpc = pytest.importorskip("grpc")

from collector.sources.podresources import api_pb2 as pb  # noqa: E402
from tests.sources.test_pod_resources import Kubelet, pb_grpc  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DCGM_PAGE = (ROOT / "tests" / "fixtures" / "dcgm-exporter" / "l4-gpu-operator.txt").read_bytes()
GPU_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"  # the page's one GPU, at PCI 0000:31:00.0


async def page_server(body: bytes) -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def start_kubelet(sock: Path) -> tuple[Any, Kubelet]:
    server = grpc.aio.server()
    k = Kubelet()
    k.pods = [
        pb.PodResources(
            name="vllm-decode-0",
            namespace="inference",
            containers=[pb.ContainerResources(name="vllm", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU_UUID])])],
        ),
        pb.PodResources(name="vllm-prefill-0", namespace="inference", containers=[pb.ContainerResources(name="vllm")]),
    ]
    pb_grpc.add_PodResourcesListerServicer_to_server(k, server)
    assert server.add_insecure_port(f"unix://{sock}") == 1
    await server.start()
    return server, k


def test_an_xid_snapshots_the_pod_the_kubelet_gave_the_gpu(tmp_path: Path) -> None:
    bg = Background()
    procs: list[subprocess.Popen[bytes]] = []
    stops: list[Any] = []
    try:
        s1, p1 = bg.run(vllm_stub())
        s2, p2 = bg.run(vllm_stub())
        s3, dport = bg.run(page_server(DCGM_PAGE))
        for s in (s1, s2, s3):
            stops.append(lambda s=s: bg.loop.call_soon_threadsafe(s.close))
        prefill = on_loopback(PODS["items"][0], p1, "100")
        decode = on_loopback(PODS["items"][1], p2, "101")
        api = RecordedApi(lists=[{**PODS, "metadata": {"resourceVersion": "110"}, "items": [prefill, decode]}], watches=[["hang"]])
        bg.run(api.start())
        stops.append(lambda: bg.run(api.stop()))
        sock_dir = tmp_path / "pod-resources"
        sock_dir.mkdir()
        kubelet, k = bg.run(start_kubelet(sock_dir / "kubelet.sock"))
        stops.append(lambda: bg.run(kubelet.stop(None)))
        (tmp_path / "token").write_text("sa-token")
        kern = tmp_path / "kern.log"
        kern.write_text("")
        sport = free_port()
        config = tmp_path / "flightrec.yaml"
        config.write_text(
            "engines: []\n"
            "discovery:\n"
            "  mode: kubernetes\n"
            "  node_name: gpu-node-a\n"
            f"  api_url: {api.url}\n"
            f"  token_file: {tmp_path / 'token'}\n"
            "  ca_file: null\n"
            "  follow_logs: false\n"
            f"  pod_resources_socket: {sock_dir / 'kubelet.sock'}\n"
            "  pod_resources_interval_s: 0.5\n"
            f"recorder_dir: {tmp_path / 'rec'}\n"
            f"gpu_metrics: dcgm\ndcgm_url: http://127.0.0.1:{dport}/metrics\ngpu_poll_interval: 0.5\n"
            f"nvml: 'off'\nkmsg: {kern}\nkmsg_poll_interval: 0.05\nscrape_interval: 0.5\nsnapshot_settle_s: 0.5\n"
        )
        side = serve(config, sport, tmp_path)
        procs.append(side)
        base = f"http://127.0.0.1:{sport}"

        def log_tail() -> str:
            return (tmp_path / "sidecar.log").read_text()[-3000:]

        def discovered() -> dict[str, Any]:
            try:
                items = get(f"{base}/healthz")["sources"]
            except (urllib.error.URLError, OSError, KeyError):
                return {}
            disc = next((s for s in items if s.get("name") == "discovery"), None)
            engines = (disc or {}).get("details", {}).get("engines") or []
            return {e["pod"]: e for e in engines}

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert side.poll() is None, log_tail()
            engines = discovered()
            if engines.get("vllm-decode-0", {}).get("gpu_indices") == [0]:
                break
            time.sleep(0.3)
        assert engines["vllm-decode-0"]["gpus_from"] == "pod_resources", (engines, log_tail())
        assert engines["vllm-decode-0"]["gpu_devices"][0]["device"] == GPU_UUID
        assert engines["vllm-prefill-0"]["gpu_indices"] is None
        assert "List" in k.calls
        [pr] = [s for s in get(f"{base}/healthz")["sources"] if s["name"] == "pod_resources"]
        assert pr["up"] and pr["details"]["devices"][0]["pod"] == "vllm-decode-0"

        # the kernel's report: Xid 79 on the GPU at 0000:31:00, its pid in no pod of this machine
        usec = int(time.monotonic() * 1e6)
        with kern.open("a") as fh:
            fh.write(f"4,900,{usec},-;NVRM: Xid (PCI:0000:31:00): 79, pid=3999999, name=python3, GPU has fallen off the bus.\n")
        snaps: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not snaps:
            assert side.poll() is None, log_tail()
            snaps = get(f"{base}/api/v1/snapshots?engine=vllm-decode-0")["items"]
            time.sleep(0.5)
        assert snaps, log_tail()
        time.sleep(2.0)  # whatever else it would snapshot has settled by now
        assert get(f"{base}/api/v1/snapshots?engine=vllm-prefill-0")["items"] == []  # not the pod without the GPU
        incident = snaps[0].get("incident_id") or 1
        view = get(f"{base}/api/v1/incidents/{incident}/view", timeout=30)
        xids = [e for e in view["timeline"] if e["xid"] == 79]  # Xid 79 is filed as gpu_lost
        assert len(xids) == 1, (snaps[0], view["timeline"])
        xid = xids[0]
        assert xid["gpu_holders"] == [{"namespace": "inference", "pod": "vllm-decode-0", "container": "vllm", "device": GPU_UUID}], xid
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for stop in stops:
            stop()
        bg.close()
