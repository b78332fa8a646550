"""Two real dumps of a process a few seconds apart (tests/fixtures/stacks, py-spy 0.4.3 over
tests/stacks/blocked_child.py: its main thread waits on a lock nobody releases, a helper waits
for work, a third thread loops), compared thread by thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.stacks import compare
from collector.stacks.pyspy import Frame, ThreadStack, parse_dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
PID = json.loads((FIXTURES / "blocked-1.json").read_text())[0]["pid"]


def _dump(name: str) -> list[ThreadStack]:
    return parse_dump((FIXTURES / name).read_text())


def _by_name(views: list[compare.ThreadView]) -> dict[str | None, compare.ThreadView]:
    return {v.name: v for v in views}


@pytest.mark.parametrize("second", ["blocked-2.json", "blocked-2-native.json"])
def test_the_blocked_main_thread_leads_with_its_blocking_frame(second: str) -> None:
    views = compare.compare(_dump("blocked-1.json"), _dump(second), pid=PID, step_process=True)
    lead = views[0]
    assert (lead.name, lead.main, lead.state) == ("MainThread", True, compare.STUCK)
    frame = lead.blocking_frame()
    assert frame is not None and (frame.function, frame.line) == ("wait_for_the_engine_lock", 19)
    v = compare.verdict(views)
    assert v.state == compare.STUCK
    blocking = v.blocking()
    assert blocking is not None and blocking["thread"] == "MainThread" and blocking["frame"]["function"] == "wait_for_the_engine_lock"


def test_a_native_second_dump_keeps_its_c_frames_above_the_blocking_one() -> None:
    views = compare.compare(_dump("blocked-1.json"), _dump("blocked-2-native.json"), pid=PID, step_process=True)
    lead = views[0]
    assert lead.blocking is not None and lead.blocking > 0
    assert all(f.native for f in lead.frames[: lead.blocking])
    d = lead.to_dict()
    assert "moved" not in d["frames"][0] and d["frames"][0]["native"] is True  # native frames are not compared
    assert d["frames"][lead.blocking]["moved"] is False


def test_the_helper_waiting_for_work_is_idle_and_the_looping_thread_moved() -> None:
    views = _by_name(compare.compare(_dump("blocked-1.json"), _dump("blocked-2.json"), pid=PID, step_process=True))
    assert views["helper-queue"].state == compare.IDLE
    mover = views["mover"]
    assert mover.state == compare.MOVING and mover.blocking is None
    assert mover.first_frames is not None and mover.first_frames[0].function == "tick_b"
    moved = {f["function"]: f["moved"] for f in mover.to_dict()["frames"]}
    # its loop is at another line, what it calls is another function; the thread's start did not move
    assert moved["mover"] is True and moved["tick_a"] is True
    assert moved["Thread.run"] is False and moved["Thread._bootstrap"] is False


def test_a_main_thread_off_the_cpu_is_idle_only_outside_the_step_processes() -> None:
    # the same lock wait in an API server: a main thread that is not in its event loop stays stuck
    views = _by_name(compare.compare(_dump("blocked-1.json"), _dump("blocked-2.json"), pid=PID, step_process=False))
    assert views["MainThread"].state == compare.STUCK
    loop = ThreadStack(PID, "MainThread", False, False, (Frame("EpollSelector.select", "/usr/lib/python3.12/selectors.py", 468),))
    views = _by_name(compare.compare([loop], [loop], pid=PID, step_process=False))
    assert views["MainThread"].state == compare.IDLE
    views = _by_name(compare.compare([loop], [loop], pid=PID, step_process=True))
    assert views["MainThread"].state == compare.STUCK  # an engine core's main thread is never idle


def test_the_caller_names_the_package_frame_under_the_standard_library() -> None:
    waits = (
        Frame("Condition.wait", "/usr/lib/python3.12/threading.py", 355),
        Frame("acquire_read", "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/shm_broadcast.py", 501),
        Frame("worker_busy_loop", "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", 700),
    )
    t = ThreadStack(PID, "MainThread", False, False, waits)
    v = compare.verdict(compare.compare([t], [t], pid=PID, step_process=True))
    b = v.blocking()
    assert b is not None
    assert b["frame"] == {"function": "Condition.wait", "file": "threading.py", "line": 355}
    assert b["in"] == {"function": "acquire_read", "file": "vllm/distributed/device_communicators/shm_broadcast.py", "line": 501}


def test_threads_that_start_or_end_between_the_dumps_and_a_single_dump() -> None:
    a = ThreadStack(1, "a", True, False, (Frame("f", "/x.py", 1),))
    b = ThreadStack(2, "b", True, False, (Frame("g", "/x.py", 2),))
    views = _by_name(compare.compare([a], [b], pid=1, step_process=True))
    assert (views["a"].state, views["b"].state) == (compare.GONE, compare.NEW)
    one = compare.compare([a], None, pid=1, step_process=True)
    assert one[0].state == compare.ONE_DUMP and compare.verdict(one).state == "unknown"
    assert compare.verdict(one).blocking() is not None  # the one dump's innermost frame, said to be uncompared
    assert compare.verdict([]).state == "unread"


def test_a_healthy_engine_core_moves() -> None:
    step1 = ThreadStack(7, "MainThread", True, True, (Frame("execute_model", "/v/vllm/x.py", 10), Frame("run_busy_loop", "/v/vllm/core.py", 5)))
    step2 = ThreadStack(7, "MainThread", True, True, (Frame("schedule", "/v/vllm/s.py", 99), Frame("run_busy_loop", "/v/vllm/core.py", 4)))
    v = compare.verdict(compare.compare([step1], [step2], pid=7, step_process=True))
    assert v.state == compare.MOVING and v.blocking() is None


def _vllm(name: str) -> tuple[list[ThreadStack], int]:
    text = (FIXTURES / name).read_text()
    return parse_dump(text), json.loads(text)[0]["pid"]


def test_a_real_vllm_engine_core_waiting_for_input_names_its_busy_loop() -> None:
    """vLLM 0.32 (CPU build), idle: the engine core's main thread waits in its busy loop's input
    queue; its socket threads and the worker monitor are idle helpers."""
    threads, pid = _vllm("vllm-engine-core.json")
    views = compare.compare(threads, threads, pid=pid, step_process=True)
    v = compare.verdict(views)
    b = v.blocking()
    assert b is not None and b["thread"] == "MainThread"
    assert b["in"] == {"function": "EngineCoreProc._process_input_queue", "file": "vllm/v1/engine/core.py", "line": 1588}
    frames = [f"{f.function} ({f.short})" for f in views[0].frames]
    assert "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py)" in frames
    helpers = {x.name: x.state for x in views[1:]}
    assert helpers and set(helpers.values()) == {compare.IDLE}, helpers


def test_a_real_vllm_api_server_at_rest_is_idle_in_its_event_loop() -> None:
    threads, pid = _vllm("vllm-api-server.json")
    v = compare.verdict(compare.compare(threads, threads, pid=pid, step_process=False))
    assert v.state == compare.IDLE and v.blocking() is None


def test_a_real_vllm_worker_waits_on_the_engine_cores_broadcast() -> None:
    threads, pid = _vllm("vllm-worker.json")
    b = compare.verdict(compare.compare(threads, threads, pid=pid, step_process=True)).blocking()
    assert b is not None
    assert b["frame"]["function"] == "Poller.poll"
    assert b["in"] == {"function": "SpinCondition.wait", "file": "vllm/distributed/device_communicators/shm_broadcast.py", "line": 210}
