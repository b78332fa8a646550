"""A real vLLM server (CPU build, the recorder installed) and its processes' stacks: found from
the pids its rings carry and the process tree, each named by its role (the API server, the
engine core, its worker), read twice by a real py-spy without pausing them; the engine core's
busy loop is in its stacks.

Needs the vLLM virtualenv (``scripts/vllm-cpu-env.sh``; ``FLIGHTREC_VLLM_PYTHON``). vLLM's
start-up is most of its time (1-8 minutes on 2 shared cores).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from collector.channel.naming import parse_ring_file_name
from collector.stacks import pyspy
from collector.stacks.capture import StackReader
from collector.stacks.settings import StacksSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from vllm_server import default_vllm_python, engine_core_pid, start_server, stop_group, wait_healthy, write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
STARTUP_S = 900.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fingerprint_from_rings(recorder_dir: Path) -> dict[str, Any]:
    """The pids the recorder reports, as the sidecar gets them: the stat logger's ring is the API
    server's, the scheduler's ring the engine core's."""
    out: dict[str, Any] = {}
    for path in recorder_dir.glob("*.ring"):
        ring = parse_ring_file_name(path.name)
        if ring is not None:
            out["server_pid" if ring.role == "stats" else "engine_core_pid"] = ring.pid
    return out


def test_a_real_vllm_servers_processes_are_found_named_and_read(tmp_path: Path) -> None:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    if pyspy.find_binary() is None:
        pytest.skip("py-spy is a dependency: pip install -e .")
    recorder_dir = tmp_path / "recorder"
    port = free_port()
    proc = start_server(
        python,
        write_tiny_model(tmp_path / "model"),
        port,
        tmp_path / "vllm.log",
        env={"FLIGHTREC_RECORDER_DIR": str(recorder_dir), "FLIGHTREC_ENGINE_NAME": "decode-0", "NCCL_DEBUG": "INFO"},
        extra_args=["--scheduler-cls", "collector.vllm.RecordingScheduler"],
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, STARTUP_S)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:  # a request served: the rings exist
            json.loads(resp.read())
        fp = fingerprint_from_rings(recorder_dir)
        assert fp.get("server_pid") == proc.pid, sorted(p.name for p in recorder_dir.glob("*"))
        core = engine_core_pid(proc.pid)
        assert core is not None and fp.get("engine_core_pid") == core
        reader = StackReader(StacksSettings(interval_s=2.0), recorder_dir=recorder_dir)
        doc = asyncio.run(reader.capture("decode-0", fp))
        if _api_server_state(doc) != "idle":
            # py-spy saw the server's loop on a CPU in one dump (a moment's work at rest, as once
            # on a loaded machine): a server at rest is idle in a second capture, a stuck one
            # stays stuck
            doc = asyncio.run(reader.capture("decode-0", fp))
        reader.close()
    finally:
        stop_group(proc)
    assert doc["status"] == "captured", doc["reasons"]
    by_role: dict[str, list[dict[str, Any]]] = {}
    for p in doc["processes"]:
        by_role.setdefault(p["role"], []).append(p)
    (server,) = by_role["api_server"]
    (engine,) = by_role["engine_core"]
    assert server["pid"] == proc.pid and engine["pid"] == core and engine["title"] == "VLLM::EngineCore"
    assert [p["title"] for p in by_role.get("worker", [])] in ([], ["VLLM::Worker"])  # the CPU build's one worker, when it starts one
    for p in (server, engine, *by_role.get("worker", [])):
        assert [d["error"] for d in p["dumps"]] == [None, None] and not any(d["native"] for d in p["dumps"])
        assert p["threads"][0]["name"] == "MainThread"
    # the engine core's busy loop, in its main thread: waiting for input here (no request in flight)
    main = engine["threads"][0]
    assert any(f["function"] == "EngineCoreProc.run_busy_loop" and f["file"] == "vllm/v1/engine/core.py" for f in main["frames"])
    assert engine["blocking"]["in"]["file"] == "vllm/v1/engine/core.py"
    # the API server at rest: its event loop waits, nothing blocks it
    assert server["state"] == "idle" and server["blocking"] is None
    assert {t["state"] for t in engine["threads"][1:]} <= {"idle"}
    # what each process ran with, secrets masked; NCCL_DEBUG as the server was started with it
    envs = [doc["env"], *(p.get("env") or {} for p in doc["processes"])]
    assert any(e.get("NCCL_DEBUG") == "INFO" for e in envs)


def _api_server_state(doc: dict[str, Any]) -> str | None:
    return next((p["state"] for p in doc.get("processes", []) if p.get("role") == "api_server"), None)
