"""The hang phase's own reading of py-spy (scripts/gpu/hang_phase.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
import hang_phase as ch  # noqa: E402

DUMP = """Process 4242: VLLM::EngineCore
Python v3.12.3 (/usr/bin/python3.12)

Thread 4242 (active): "MainThread"
    synchronize (torch/cuda/streams.py:231)
    get_output (vllm/v1/worker/gpu/async_utils.py:174)
    step_with_batch_queue (vllm/v1/engine/core.py:430)
    run_busy_loop (vllm/v1/engine/core.py:960)
Thread 4300 (idle): "EngineCoreOutputThread"
    wait (threading.py:355)
"""


def test_main_thread_frames_from_a_py_spy_dump() -> None:
    top = ch.main_thread(DUMP)
    assert top is not None and top[0] == "synchronize (torch/cuda/streams.py:231)" and len(top) == 4
    assert ch.main_thread("") is None and ch.main_thread("Process 1: x\n") is None
