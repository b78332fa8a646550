"""A real vLLM (CPU build) as a discovered pod: its recorder is given the pod's UID the way the
downward API gives it (``FLIGHTREC_POD_UID``), and no ``FLIGHTREC_ENGINE_NAME``, so its rings are
named ``vllm-<pid>``; a real ``flightrec serve`` in the DaemonSet's form finds the pod through a
stand-in API server (loopback HTTP) and joins the rings to it by that UID: the steps of the
requests sent land under the pod's engine, joined by pod, and no engine nobody configured
appears.

Needs the vLLM virtualenv (``FLIGHTREC_VLLM_PYTHON``). Takes 1-3 minutes, most of it vLLM's
start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_discovery_serve import Background, free_port, get
from tests.sources.kubeapi_fake import RecordedApi
from tests.sources.test_discovery import PODS, on_loopback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from vllm_server import default_vllm_python, start_server, stop_group, wait_healthy, write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
STARTUP_S = 300.0


def complete(base: str, model: str, n: int) -> None:
    body = json.dumps({"model": model, "prompt": list(range(5, 5 + n)), "max_tokens": 4, "ignore_eos": True})
    req = urllib.request.Request(f"{base}/v1/completions", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310 - loopback
        resp.read()


def test_a_real_vllms_rings_join_their_discovered_pod_by_uid(tmp_path: Path) -> None:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    recorder_dir = tmp_path / "rec"
    model = write_tiny_model(tmp_path / "model")
    vport = free_port()
    pod = on_loopback(PODS["items"][1], vport, "100")  # vllm-decode-0
    uid = pod["metadata"]["uid"]
    bg = Background()
    procs: list[subprocess.Popen[bytes]] = []
    api = RecordedApi(lists=[{**PODS, "metadata": {"resourceVersion": "110"}, "items": [pod]}], watches=[["hang"]])
    try:
        bg.run(api.start())
        server = start_server(
            python,
            model,
            vport,
            tmp_path / "vllm.log",
            env={"FLIGHTREC_RECORDER_DIR": str(recorder_dir), "FLIGHTREC_POD_UID": uid, "FLIGHTREC_ENGINE_NAME": None},
            extra_args=["--scheduler-cls", "collector.vllm.RecordingScheduler", "--kv-cache-memory-bytes", "4194304"],
        )
        procs.append(server)
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
            "  follow_logs: false\n"
            "  pod_resources: false\n"
            f"recorder_dir: {recorder_dir}\n"
            "nvml: 'off'\nkmsg: 'off'\nscrape_interval: 1.0\n"
        )
        side = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "serve",
                "--config",
                str(config),
                "--port",
                str(sport),
                "--db",
                f"sqlite:///{tmp_path / 'fr.db'}",
            ],
            stdout=open(tmp_path / "sidecar.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            start_new_session=True,
            cwd=tmp_path,
        )
        procs.append(side)
        wait_healthy(f"http://127.0.0.1:{vport}", server, STARTUP_S)
        for n in (8, 16, 24):
            complete(f"http://127.0.0.1:{vport}", str(model), n)
        base = f"http://127.0.0.1:{sport}"

        def log_tail() -> str:
            return (tmp_path / "sidecar.log").read_text()[-3000:] + (tmp_path / "vllm.log").read_text()[-2000:]

        engine: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert side.poll() is None, log_tail()
            try:
                items = get(f"{base}/api/v1/engines")["items"]
            except (urllib.error.URLError, OSError, KeyError):
                time.sleep(0.5)
                continue
            engine = next((e for e in items if e["name"] == "vllm-decode-0"), {})
            if engine.get("steps_received"):
                break
            time.sleep(0.5)
        assert engine.get("steps_received"), (items, log_tail())
        assert [e["name"] for e in items] == ["vllm-decode-0"], items  # no vllm-<pid> beside it
        assert (engine["fingerprint"] or {}).get("pod_uid") == uid
        [rec] = [s for s in get(f"{base}/healthz")["sources"] if s["name"] == "recorder"]
        assert rec["details"]["joined_by"] == {"vllm-decode-0": "pod"}, rec["details"]
        assert rec["details"]["unconfigured"] == []
    finally:
        for p in procs:
            stop_group(p)
        bg.run(api.stop())
        bg.close()
