"""The report: its environment section does not trust one NVML sample; a wedge's snapshot
carries its stacks (each process's blocking frame, the threads that did not move, the GPUs at
the dumps, the environment, with no install prefix in a path); a crash's report has no such
section."""

from __future__ import annotations

import copy
import json
from typing import Any

from collector.model import EventKind
from collector.report.bundle import build_bundle
from collector.report.markdown import _environment, render
from tests.stacks.sample import stacks_part

SITE = "/usr/local/lib/python3.12/dist-packages/"


def _wedge_export() -> dict[str, Any]:
    stacks = stacks_part()
    # as a real engine's: vLLM's frames under the install prefix (the recorded dump is a test script's)
    core = stacks["processes"][0]
    core["threads"][0]["frames"].append({"function": "run_busy_loop", "file": SITE + "vllm/v1/engine/core.py", "line": 895, "moved": False})
    core["blocking"]["in"] = {"function": "run_busy_loop", "file": SITE + "vllm/v1/engine/core.py", "line": 895}
    return {
        "schema": "flightrec.snapshot/v1",
        "id": 4,
        "incident_id": 2,
        "host": "gpu-node-3.corp.example",
        "engine": "decode-0",
        "created_at": 1_796_000_020.0,
        "fault_ts": 1_796_000_010.0,
        "trigger": {"kind": EventKind.ENGINE_WEDGED.value, "source": "detector", "message": "decode-0 wedged: 8 running, no step for 20 s"},
        "summary": {},
        "fingerprint": {"vllm_version": "0.32.0", "hostname": "gpu-node-3.corp.example"},
        "steps": [],
        "requests": {"columns": {}, "sparse": []},
        "gpu_samples": [],
        "events": [],
        "log_lines": [],
        "peers": [],
        "workload": None,
        "scrapes": [],
        "stacks": stacks,
    }


def test_the_report_names_each_processs_blocking_frame_without_install_prefixes() -> None:
    text = render(_wedge_export())
    section = text[text.index("#### The engine's stacks while it was wedged") : text.index("#### The last steps")]
    assert "**partial**" in section
    assert "| engine_core `VLLM::EngineCore` | 9682 | stuck | wait_for_the_engine_lock (" in section
    assert "run_busy_loop (vllm/v1/engine/core.py:895)" in section and SITE not in section
    assert "- stacks not read: the process exited before py-spy read it [worker 9683]" in section
    assert "Thread MainThread (tid 9682, main): stuck" in section
    assert "= wait_for_the_engine_lock (" in section and "· PyThread_acquire_lock_timed (libpython3.11.so.1.0)" in section
    assert "Idle threads (waiting for work in both dumps): helper-queue." in section
    assert "100.0 → 100.0" in section and "collective" in section
    assert "NCCL_DEBUG=INFO" in section


def test_a_crash_report_has_no_stacks_section() -> None:
    export = _wedge_export()
    del export["stacks"]
    assert "stacks while it was wedged" not in render(export)


def test_the_bundle_keeps_the_stacks_scrubbed() -> None:
    export = _wedge_export()
    export["stacks"]["env"]["MASTER_ADDR"] = "gpu-node-3.corp.example"
    before = copy.deepcopy(export)
    import io
    import tarfile

    body = build_bundle(export, report=render)
    assert export == before  # the input is untouched
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        files = {m.name.rsplit("/", 1)[-1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]
    snap = json.loads(files["snapshot.json"])
    assert snap["stacks"]["processes"][0]["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"
    assert "gpu-node-3.corp.example" not in files["snapshot.json"] and "gpu-node-3.corp.example" not in files["report.md"]
    assert "MASTER_ADDR=host-1" in files["report.md"]


def test_a_gpus_memory_is_what_most_samples_say_and_a_disagreeing_sample_is_named() -> None:
    one = {"gpu": "GPU-a", "index": 1, "name": "NVIDIA H200", "bus_id": "00000000:00:06.0"}
    samples = [dict(one, memory_total=80 * 2**30)] + [dict(one, memory_total=141 * 2**30) for _ in range(5)]
    [line] = [ln for ln in _environment({"gpu_samples": samples}, {}) if ln.startswith("  GPU 1")]
    assert "141 GiB (1 of 6 samples said otherwise: 80 GiB) memory" in line
    [line] = [ln for ln in _environment({"gpu_samples": samples[1:]}, {}) if ln.startswith("  GPU 1")]
    assert line.endswith("141 GiB memory")
