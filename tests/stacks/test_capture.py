"""The whole capture against real processes and a real py-spy: a Python process blocked in a
known function is found, read twice, and its blocking frame named; a py-spy that hangs, is
missing or is refused leaves everything else and one line per cause."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.model import GpuSample
from collector.stacks import part, pyspy
from collector.stacks.capture import StackReader
from collector.stacks.settings import StacksSettings
from tests.stacks import fakeproc

CHILD = Path(__file__).with_name("blocked_child.py")
PY_SPY = pyspy.find_binary()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is a dependency: pip install -e .")


@pytest.fixture
def engine_core() -> Iterator[subprocess.Popen[bytes]]:
    """A process titled like vLLM's engine core whose main thread waits on a lock for ever."""
    env = {"PATH": os.environ.get("PATH", ""), "NCCL_DEBUG": "INFO", "VLLM_API_KEY": "sk-notarealkey123", "CUDA_VISIBLE_DEVICES": "0"}
    p = subprocess.Popen([sys.executable, str(CHILD), "VLLM::EngineCore"], stdout=subprocess.PIPE, env=env)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    time.sleep(0.5)  # "ready" comes just before the main thread enters the function it blocks in
    yield p
    p.kill()
    p.wait()


def _gpu(ts: float) -> list[GpuSample]:
    return [GpuSample(gpu="GPU-0", index=0, ts=ts, name="NVIDIA H100", utilization=100.0, processes=[{"pid": 1, "used_memory": 1 << 30}])]


@needs_py_spy
def test_a_blocked_process_is_read_twice_and_its_blocking_frame_named(engine_core: subprocess.Popen[bytes]) -> None:
    reader = StackReader(StacksSettings(interval_s=1.0, native=True), recorder_dir=None)
    t0 = time.monotonic()
    doc = asyncio.run(reader.capture("decode-0", {"engine_core_pid": engine_core.pid}, lambda: _gpu(time.time())))
    took = time.monotonic() - t0
    reader.close()
    assert doc["schema"] == part.SCHEMA and doc["status"] == part.CAPTURED, doc["reasons"]
    assert 1.0 <= took < reader.bound_s
    (proc,) = doc["processes"]
    assert (proc["role"], proc["pid"], proc["state"]) == ("engine_core", engine_core.pid, "stuck")
    assert [d["error"] for d in proc["dumps"]] == [None, None]
    assert proc["dumps"][1]["ts"] - proc["dumps"][0]["ts"] >= 0.9  # a few seconds apart (here 1)
    b = proc["blocking"]
    assert (b["thread"], b["frame"]["function"], b["frame"]["line"]) == ("MainThread", "wait_for_the_engine_lock", 19)
    threads = {t["name"]: t for t in proc["threads"]}
    assert proc["threads"][0]["name"] == "MainThread"
    assert threads["helper-queue"]["state"] == "idle"
    assert doc["env"]["NCCL_DEBUG"] == "INFO" and doc["env"]["VLLM_API_KEY"] == "***"
    assert "sk-notarealkey123" not in repr(doc)
    (gpu,) = doc["gpus"]
    assert len(gpu["readings"]) == 2 and gpu["hint"] is not None
    assert doc["tool"]["version"]
    if proc["dumps"][1]["native"]:  # native frames above the blocking one, where py-spy could unwind
        main = threads["MainThread"]
        assert any(f.get("native") for f in main["frames"][: main["blocking"]])
    s = part.summary(doc)
    assert s is not None and s["processes"][0]["blocking"].startswith("wait_for_the_engine_lock (")


@needs_py_spy
def test_a_stopped_engine_core_is_read_and_said_to_be_stopped(engine_core: subprocess.Popen[bytes]) -> None:
    """SIGSTOP, as the issue's second wedge: py-spy reads a stopped process; the snapshot says it is stopped."""
    os.kill(engine_core.pid, signal.SIGSTOP)
    try:
        reader = StackReader(StacksSettings(interval_s=0.5), recorder_dir=None)
        doc = asyncio.run(reader.capture("decode-0", {"engine_core_pid": engine_core.pid}))
        reader.close()
    finally:
        os.kill(engine_core.pid, signal.SIGCONT)
    assert doc["status"] == part.CAPTURED
    (proc,) = doc["processes"]
    assert proc["os_state"] == "T" and proc["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"
    assert f"engine_core {engine_core.pid} is stopped (SIGSTOP, or a debugger): it cannot step until it is continued (SIGCONT)" in doc["notes"]


def _fake_py_spy(body: str) -> str:
    d = Path(tempfile.mkdtemp(prefix="flightrec-pyspy-"))
    path = d / "py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_py_spy_that_hangs_costs_the_stacks_only(engine_core: subprocess.Popen[bytes]) -> None:
    reader = StackReader(StacksSettings(interval_s=0.5, timeout_s=0.5, native=False), recorder_dir=None, binary=_fake_py_spy("sleep 60"))
    t0 = time.monotonic()
    doc = asyncio.run(reader.capture("decode-0", {"engine_core_pid": engine_core.pid}, lambda: _gpu(time.time())))
    assert time.monotonic() - t0 < 5.0
    assert doc["status"] == part.UNAVAILABLE
    (line,) = doc["reasons"]
    assert "did not answer within 0.5 s" in line and f"engine_core {engine_core.pid}" in line
    (proc,) = doc["processes"]
    assert proc["state"] == "unread" and proc["title"] == "VLLM::EngineCor"
    assert doc["env"]["NCCL_DEBUG"] == "INFO" and len(doc["gpus"]) == 1  # the rest is kept


def test_a_missing_py_spy_is_one_line(engine_core: subprocess.Popen[bytes]) -> None:
    reader = StackReader(StacksSettings(interval_s=0.5, py_spy="/nonexistent/py-spy"), recorder_dir=None)
    assert reader.binary is None
    doc = asyncio.run(reader.capture("decode-0", {"engine_core_pid": engine_core.pid}))
    assert doc["status"] == part.UNAVAILABLE
    assert doc["reasons"] == [
        f"stacks not read: py-spy is not installed beside the sidecar (pip install py-spy, or set stacks.py_spy) [engine_core {engine_core.pid}]"
    ]


@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run py-spy as another user")
def test_py_spys_own_refusal_is_translated(engine_core: subprocess.Popen[bytes]) -> None:
    """py-spy run as nobody against a root process: the kernel refuses it (what a sidecar of another
    uid without CAP_SYS_PTRACE meets where /proc/self could not tell beforehand)."""
    assert PY_SPY is not None
    copy = Path(tempfile.mkdtemp(prefix="flightrec-pyspy-")) / "py-spy-real"
    shutil.copy(PY_SPY, copy)
    copy.parent.chmod(0o755)
    copy.chmod(copy.stat().st_mode | stat.S_IXOTH | stat.S_IROTH)
    wrapper = _fake_py_spy(f'exec setpriv --reuid=65534 --regid=65534 --clear-groups {copy} "$@"')
    reader = StackReader(StacksSettings(interval_s=0.5, native=True), recorder_dir=None, binary=wrapper)
    doc = asyncio.run(reader.capture("decode-0", {"engine_core_pid": engine_core.pid}))
    assert doc["status"] == part.UNAVAILABLE
    (line,) = doc["reasons"]
    assert line.startswith("stacks not read: the kernel refused py-spy (Permission Denied") and f"engine_core {engine_core.pid}" in line


def test_a_refusal_seen_beforehand_runs_no_py_spy_and_is_one_line(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fakeproc.reader(proc, uid=0, cap_sys_ptrace=False, yama=1)
    fakeproc.add(proc, 100, ppid=1, cmdline=["vllm", "serve", "m"], environ={"NCCL_DEBUG": "INFO"})
    fakeproc.add(proc, 101, ppid=100, cmdline=["VLLM::EngineCore"], environ={"NCCL_DEBUG": "INFO"})
    fakeproc.add(proc, 102, ppid=101, cmdline=["VLLM::Worker_TP0"])
    fakeproc.add(proc, 103, ppid=101, cmdline=["VLLM::Worker_TP1"])
    ran = tmp_path / "ran"
    reader = StackReader(StacksSettings(interval_s=0.5), recorder_dir=None, proc=proc, binary=_fake_py_spy(f"touch {ran}; echo '[]'"))
    doc = asyncio.run(reader.capture("decode-0", {"server_pid": 100}))
    assert not ran.exists()
    assert doc["status"] == part.UNAVAILABLE
    (line,) = doc["reasons"]
    assert "ptrace_scope is 1" in line and line.endswith("[engine_core 101, worker 102, worker 103, api_server 100]")
    assert [p["role"] for p in doc["processes"]] == ["engine_core", "worker", "worker", "api_server"]
    assert doc["env"] == {"NCCL_DEBUG": "INFO"}  # what /proc still let it read is kept


def test_an_engine_without_known_pids() -> None:
    reader = StackReader(StacksSettings(), recorder_dir=None)
    doc = asyncio.run(reader.capture("decode-0", {}))
    assert doc["status"] == part.UNAVAILABLE and "no in-engine recorder reported their pids" in doc["reasons"][0]


def test_what_will_keep_the_stacks_from_being_read_is_said_at_start(tmp_path: Path) -> None:
    fakeproc.reader(tmp_path, uid=0, cap_sys_ptrace=False, yama=1)
    reader = StackReader(StacksSettings(), recorder_dir=None, proc=tmp_path, binary="/bin/true")
    assert "ptrace_scope is 1" in (reader.readiness() or "")
    missing = StackReader(StacksSettings(py_spy="/nonexistent/py-spy"), recorder_dir=None, proc=tmp_path)
    assert "py-spy is not installed" in (missing.readiness() or "")
    fakeproc.reader(tmp_path / "ok", uid=0, cap_sys_ptrace=True, yama=1)
    assert StackReader(StacksSettings(), recorder_dir=None, proc=tmp_path / "ok", binary="/bin/true").readiness() is None


def test_a_simulated_engine_is_said_to_have_no_processes() -> None:
    reader = StackReader(StacksSettings(), recorder_dir=None)
    doc = asyncio.run(reader.capture("decode-0", {"server_pid": 3107, "simulated": True}))
    assert doc["status"] == part.UNAVAILABLE and doc["reasons"] == ["stacks not read: a simulated engine has no processes of its own"]
