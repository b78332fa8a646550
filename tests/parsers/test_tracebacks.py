"""LogEventizer over real vLLM 0.32 logs and the incident's traceback (PRODUCT.md)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.model import Event, EventKind, Severity
from collector.parsers.log_classify import classify
from collector.parsers.traceback_grammar import parse_frames
from collector.parsers.tracebacks import LogEventizer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"
UTC = UTC
# Fixture logs were written in November 2026 (their files' year); the incident in September.
REF = datetime(2026, 12, 1, tzinfo=UTC).timestamp()


def _run(lines: list[str], *, ref: float = REF) -> list[Event]:
    ev = LogEventizer("decode-0", reference_clock=lambda: ref, tz=UTC)
    out: list[Event] = []
    for raw in lines:
        out += ev.feed(raw)
    out += ev.flush()
    return sorted(out, key=lambda e: e.data["line"])


def _fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8", errors="replace").splitlines()


def _critical(events: list[Event]) -> list[tuple[str, str | None]]:
    return [(e.kind.value, e.process) for e in events if e.severity is Severity.CRITICAL]


# The frame chain of the incident as the report gives it (PRODUCT.md), after the two
# executor frames that vLLM 0.32 puts above execute_model.
INCIDENT_TP0 = [
    ("vllm/v1/worker/gpu/model_runner.py", 1928, "execute_model", "self.kv_connector.finish_forward()"),
    ("vllm/v1/worker/gpu/kv_connector.py", 96, "finish_forward", None),
    ("vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py", 310, "finish_forward", None),
    ("vllm/distributed/kv_transfer/kv_connector/v1/hisparse/connector.py", 247, "finish_forward", None),
    (
        "vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py",
        831,
        "finish_forward",
        "self._finish_mirror_phase(self._forward_ready_event)",
    ),
    ("vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py", 823, "_finish_mirror_phase", "state.event.synchronize()"),
]
ACCEL = "torch.AcceleratorError: CUDA error: unspecified launch failure"


def _chain(event: Event) -> list[tuple]:
    return [(f["file"], f["line"], f["func"], f["code"]) for f in event.frames]


def test_incident_two_workers_interleaved_give_one_event_each():
    events = _run(_fixture("incident-decode.log"))
    assert _critical(events) == [
        ("cuda_error", "Worker_TP0"),
        ("cuda_error", "Worker_TP1"),
        ("engine_fatal", "EngineCore"),
        ("engine_dead", "APIServer"),
    ]
    tp0, tp1 = events[0], events[1]
    assert (tp0.pid, tp1.pid) == (3107, 3108)
    assert _chain(tp0)[-len(INCIDENT_TP0) :] == INCIDENT_TP0
    assert _chain(tp1)[-1] == ("vllm/v1/worker/gpu/async_utils.py", 168, "get_output", "self.copy_event.synchronize()")
    for e in (tp0, tp1):
        assert e.message == ACCEL
        assert e.data["exception"].startswith(ACCEL + "\nCUDA kernel errors might be")
        assert all(line.startswith(f"({e.process} pid={e.pid})") for line in e.lines)
    assert tp0.data["lead"] == "WorkerProc hit an exception."
    assert tp0.ts == datetime(2026, 9, 13, 10, 41, 7, tzinfo=UTC).timestamp()


def test_incident_launch_blocking_variant_ends_in_graph_replay():
    [event] = _run(_fixture("incident-decode-launch-blocking.log"))
    assert event.kind is EventKind.CUDA_ERROR
    assert _chain(event)[-1] == ("vllm/v1/worker/gpu/cudagraph_utils.py", 486, "run_fullgraph", "self.graphs[desc].replay()")


def test_bare_stderr_traceback_follows_the_grammar():
    events = _run(_fixture("incident-decode-stderr.log"))
    [tb] = [e for e in events if e.frames]
    assert tb.kind is EventKind.CUDA_ERROR and tb.process is None
    assert _chain(tb) == INCIDENT_TP0
    assert tb.data["exception"].count("\n") == 3  # torch's three hint lines joined
    assert not any("Shutting down" in line for line in tb.lines)


def test_real_crash_log_fault_plugin():
    events = _run(_fixture("crash.log"))
    assert _critical(events) == [
        ("cuda_error", "Worker"),
        ("crash_dump", "EngineCore"),
        ("engine_fatal", "EngineCore"),
        ("engine_dead", "APIServer"),
    ]
    worker = next(e for e in events if e.kind is EventKind.CUDA_ERROR)
    # vLLM 0.32 prints this traceback twice in one record: kept once
    assert [f["func"] for f in worker.frames] == ["_execute_worker_rpc", "execute_model", "execute_model"]
    assert worker.frames[-1]["code"] == "raise RuntimeError(message)"
    assert worker.data["exceptions"] == ["RuntimeError: CUDA error: unspecified launch failure"]
    fatal = next(e for e in events if e.kind is EventKind.ENGINE_FATAL)
    assert fatal.data["lead"] == "EngineCore encountered a fatal error."
    assert fatal.data["matches"] == ["cuda_error", "engine_fatal"]
    assert fatal.frames[0]["func"] == "run_engine_core"
    # a plugin that failed to load is a traceback worth keeping, not a crash
    log = [e for e in events if e.kind is EventKind.LOG]
    assert log and all(e.severity is Severity.WARNING for e in log)


def test_real_tp2_crash_both_workers_fail_in_one_step():
    events = _run(_fixture("crash-tp2.log"))
    assert _critical(events) == [
        ("cuda_error", "Worker_TP0"),
        ("crash_dump", "EngineCore"),
        ("engine_fatal", "EngineCore"),
        ("engine_dead", "APIServer"),
        ("cuda_error", "Worker_TP1"),
    ]
    workers = [e for e in events if e.kind is EventKind.CUDA_ERROR]
    assert workers[0].ts == workers[1].ts and workers[0].pid != workers[1].pid
    assert [f["func"] for f in workers[0].frames] == [f["func"] for f in workers[1].frames]
    dump = next(e for e in events if e.kind is EventKind.CRASH_DUMP)
    assert dump.data["config"]["tensor_parallel_size"] == 2
    assert dump.data["stats"]["running"] == len(dump.data["requests"])


def test_real_sigkill_log():
    events = _run(_fixture("sigkill.log"))
    dead = [e for e in events if e.kind is EventKind.ENGINE_DEAD]
    assert dead[0].message == "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    assert dead[0].data["level"] == "WARNING"
    assert any("EngineDeadError" in e.message for e in dead[1:])
    assert not any(e.kind is EventKind.CUDA_ERROR for e in events)


def test_graceful_stop_is_not_a_crash():
    # vLLM 0.32 logs EngineDeadError on a SIGINT stop too (normal.log, end)
    events = _run(_fixture("normal.log"))
    assert _critical(events) == []
    stop = [e for e in events if e.data.get("during_shutdown")]
    assert len(stop) == 1 and "EngineDeadError" in stop[0].message
    assert stop[0].severity is Severity.INFO


DEATH_LINES = [
    (
        "(EngineCore_DP0 pid=77) ERROR 09-13 10:41:08 [multiproc_executor.py:316] Worker proc "
        "VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
        EventKind.ENGINE_DEAD,
        {"worker": "VllmWorker-1", "exit_code": -9},
    ),
    (
        "(APIServer pid=1) ERROR 09-13 10:41:08 [utils.py:593] RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.",
        EventKind.ENGINE_DEAD,
        {"dead_process": "EngineCore_DP0"},
    ),
    (
        "(APIServer pid=1) WARNING 09-13 10:41:08 [core_client.py:817] [shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        EventKind.ENGINE_DEAD,
        {},
    ),
    ("(EngineCore pid=7) ERROR 09-13 10:41:08 [core.py:1510] EngineCore failed to start.", EventKind.ENGINE_DEAD, {}),
    ("(EngineCore pid=7) ERROR 09-13 10:41:08 [core.py:1512] EngineCore encountered a fatal error.", EventKind.ENGINE_FATAL, {}),
    (
        "(APIServer pid=1) ERROR 09-13 10:41:08 [x.py:1] RuntimeError: Process EngineCore_DP0 (PID: 77) died with exit code -9",
        EventKind.ENGINE_DEAD,
        {"dead_process": "EngineCore_DP0", "dead_pid": 77, "exit_code": -9},
    ),
    (
        "(Worker_TP1 pid=3108) ERROR 09-13 10:41:08 [pynccl.py:1] torch.distributed.DistBackendError: "
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
        EventKind.NCCL_ERROR,
        {},
    ),
    (
        "(Worker_TP0 pid=3107) WARNING 09-13 10:41:08 [x.py:1] node:3107:3107 [0] NCCL WARN Cuda failure 'unspecified launch failure'",
        EventKind.CUDA_ERROR,
        {},
    ),
    ("(Worker_TP0 pid=3107) ERROR 09-13 10:41:08 [x.py:1] RuntimeError: CUDA error: device-side assert triggered", EventKind.CUDA_ERROR, {}),
    (
        "(Worker_TP0 pid=3107) ERROR 09-13 10:41:08 [x.py:1] cudaErrorIllegalAddress: an illegal memory access was encountered",
        EventKind.CUDA_ERROR,
        {},
    ),
    ("(APIServer pid=1) ERROR 09-13 10:41:08 [serving.py:1] Error in request cmpl-1", EventKind.LOG, {}),
]


@pytest.mark.parametrize("raw,kind,facts", DEATH_LINES, ids=[d[0][-40:] for d in DEATH_LINES])
def test_single_lines(raw, kind, facts):
    [event] = _run([raw])
    assert event.kind is kind
    assert event.severity is (Severity.WARNING if kind is EventKind.LOG else Severity.CRITICAL)
    for key, value in facts.items():
        assert event.data[key] == value
    assert event.lines == [raw]


def test_info_lines_make_no_event():
    assert _run(["(APIServer pid=1) INFO 09-13 10:41:08 [x.py:1] Starting vLLM API server"]) == []


def test_chained_traceback():
    text = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "    g()",
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 2, in h',
        "    raise RuntimeError('CUDA error: misaligned address')",
        "RuntimeError: CUDA error: misaligned address",
    ]
    frames, exceptions = parse_frames(text)
    assert [(f["file"], f["chain"]) for f in frames] == [("a.py", 0), ("b.py", 1)]
    assert exceptions == ["KeyError: 'x'", "RuntimeError: CUDA error: misaligned address"]
    [event] = _run(text)
    assert event.kind is EventKind.CUDA_ERROR and event.message.startswith("RuntimeError")


def test_a_traceback_that_ends_the_log_waits_for_flush():
    t = [100.0]
    ev = LogEventizer(reference_clock=lambda: t[0], tz=UTC)
    lines = _fixture("incident-decode-launch-blocking.log")
    assert [e for raw in lines for e in ev.feed(raw)] == []
    assert ev.flush(idle=1.0, now=100.5) == []  # still possibly being written
    [event] = ev.flush(idle=1.0, now=101.5)
    assert event.kind is EventKind.CUDA_ERROR
    assert ev.flush() == []


def test_classify_orders_cause_first():
    assert classify("NCCL WARN Cuda failure 'an illegal memory access was encountered'") == [EventKind.CUDA_ERROR, EventKind.NCCL_ERROR]
    assert classify("all good") == []


def _interleave(a: list[str], b: list[str], seed: int) -> list[str]:
    rnd = random.Random(seed)
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and rnd.random() < 0.5):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_any_interleaving_of_two_workers_gives_the_same_events(seed):
    lines = _fixture("incident-decode.log")
    tp0 = [x for x in lines if x.startswith("(Worker_TP0")]
    tp1 = [x for x in lines if x.startswith("(Worker_TP1")]
    events = _run(_interleave(tp0, tp1, seed))
    by_proc = {e.process: _chain(e) for e in events}
    assert by_proc["Worker_TP0"][-len(INCIDENT_TP0) :] == INCIDENT_TP0
    assert by_proc["Worker_TP1"][-1][1] == 168
    assert len(events) == 2


_REAL = [x for name in ("crash.log", "incident-decode.log", "sigkill.log") for x in _fixture(name)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=200),
            st.builds(lambda i, cut: _REAL[i % len(_REAL)][:cut], st.integers(0, 10**6), st.integers(0, 400)),
        ),
        max_size=30,
    )
)
def test_no_input_makes_the_eventizer_raise(lines):
    events = _run(lines)
    assert all(isinstance(e, Event) and e.source == "log" for e in events)
