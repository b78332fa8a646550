"""The DaemonSet's configuration end to end, with a real `flightrec serve`: no engine listed,
discovery finds the node's vLLM pod through a stand-in API server answering with pods written in the v1 API's
shape (loopback HTTP: no kube-apiserver can run here), scrapes it (a loopback engine serving a
captured vLLM page), follows its container log in a kubelet-style /var/log/pods folder, and a
CUDA error written there in the CRI format becomes a snapshot of that engine; /metrics names
the pod the engine runs in."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.sources.kubeapi_fake import RecordedApi
from tests.sources.test_discovery import PODS, on_loopback, vllm_stub
from tests.support.sidecar import serve

pytestmark = pytest.mark.slow
TS = "2026-12-03T10:00:00.000000001Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
        body = r.read().decode()
    return json.loads(body) if body.lstrip().startswith(("{", "[")) else body


class Background:
    """The recorded API server and the engine, on a loop of their own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_serve_finds_the_pod_and_snapshots_its_cuda_error(tmp_path: Path) -> None:
    bg = Background()
    procs: list[subprocess.Popen[bytes]] = []
    stops: list[Any] = []
    try:
        server, vport = bg.run(vllm_stub())
        stops.append(lambda: bg.loop.call_soon_threadsafe(server.close))
        decode = on_loopback(PODS["items"][1], vport, "100")  # vllm-decode-0, kv_consumer, pair pd-0
        api = RecordedApi(lists=[{**PODS, "metadata": {"resourceVersion": "110"}, "items": [decode]}], watches=[["hang"]])
        bg.run(api.start())
        stops.append(lambda: bg.run(api.stop()))
        meta = decode["metadata"]
        folder = tmp_path / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "vllm"
        folder.mkdir(parents=True)
        (folder / "0.log").write_text(f"{TS} stdout F INFO started before the sidecar\n")
        (tmp_path / "token").write_text("sa-token")
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
            f"  log_root: {tmp_path / 'pods'}\n"
            f"recorder_dir: {tmp_path / 'rec'}\n"
            "nvml: 'off'\nkmsg: 'off'\nscrape_interval: 0.5\nsnapshot_settle_s: 0.5\n"
        )
        side = serve(config, sport, tmp_path)
        procs.append(side)
        base = f"http://127.0.0.1:{sport}"

        def log_tail() -> str:
            return (tmp_path / "sidecar.log").read_text()[-3000:]

        deadline = time.monotonic() + 60
        engine: dict[str, Any] | None = None
        while time.monotonic() < deadline and engine is None:
            assert side.poll() is None, log_tail()
            try:
                engines = get(f"{base}/api/v1/engines")
                items = engines["items"]
                engine = next((e for e in items if e.get("name") == "vllm-decode-0" and e.get("up")), None)
            except (urllib.error.URLError, OSError, KeyError):
                pass
            time.sleep(0.3)
        assert engine is not None, log_tail()
        assert engine.get("url") == f"http://127.0.0.1:{vport}"
        # the API server was asked for this node's labelled pods with the token
        assert api.requests[0].query["fieldSelector"] == "spec.nodeName=gpu-node-a"
        assert api.requests[0].headers["authorization"] == "Bearer sa-token"

        with open(folder / "0.log", "a") as fh:
            for line in (
                "(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710] EngineCore encountered a fatal error.",
                "(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710] Traceback (most recent call last):",
                '(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710]   File "x.py", line 1, in f',
                "(EngineCore_DP0 pid=7) ERROR 12-03 10:00:00 [core.py:710] torch.AcceleratorError: CUDA error: unspecified launch failure",
            ):
                fh.write(f"{TS} stderr F {line}\n")
        snaps: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not snaps:
            assert side.poll() is None, log_tail()
            snaps = get(f"{base}/api/v1/snapshots?engine=vllm-decode-0")["items"]
            time.sleep(0.5)
        assert snaps, log_tail()
        assert snaps[0]["engine"] == "vllm-decode-0", snaps[0]
        doc = get(f"{base}/api/v1/snapshots/{snaps[0]['id']}", timeout=30)
        text = json.dumps(doc)
        assert "CUDA error: unspecified launch failure" in text
        assert "started before the sidecar" not in text  # the log was followed from its end at start
        metrics = get(f"{base}/metrics")
        assert (
            'flightrec_engine_info{Hostname="' in metrics
            and 'engine="vllm-decode-0",namespace="inference",pair="pd-0",pod="vllm-decode-0",role="decode"} 1.0' in metrics
        ), [ln for ln in metrics.splitlines() if "engine_info" in ln]
        assert 'flightrec_source_up{Hostname="' in metrics and 'source="discovery"} 1.0' in metrics
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
