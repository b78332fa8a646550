"""Line parsing over real vLLM 0.32 lines (tests/fixtures/vllm-logs) and the year rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.parsers.vllm_log import parse_line, parse_timestamp

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"


def _line(name: str, contains: str) -> str:
    for raw in (FIXTURES / name).read_text(encoding="utf-8", errors="replace").splitlines(True):
        if contains in raw:
            return raw
    raise AssertionError(f"{contains!r} not in {name}")


# (fixture, a substring that picks the line, process, pid, level, stamp, location, message start)
CASES = [
    ("normal.log", "Engine 000: Avg prompt", "APIServer", None, "INFO", None, "loggers.py:335", "Engine 000: Avg prompt throughput"),
    ("crash.log", "WorkerProc hit an exception", "Worker", None, "ERROR", None, "multiproc_executor.py:1063", "WorkerProc hit an exception."),
    ("crash.log", "Dumping scheduler stats", "EngineCore", None, "ERROR", None, "dump_input.py:81", "Dumping scheduler stats: SchedulerStats("),
    ("crash-tp2.log", "(Worker_TP1 pid=", "Worker_TP1", None, None, None, None, None),
    (
        "incident-decode.log",
        "Error getting async model runner output",
        "Worker_TP1",
        3108,
        "ERROR",
        "09-13 10:41:07",
        "multiproc_executor.py:1000",
        "Error getting async model runner output",
    ),
    (
        "incident-decode.log",
        "state.event.synchronize()",
        "Worker_TP0",
        3107,
        "ERROR",
        "09-13 10:41:07",
        "multiproc_executor.py:1063",
        "    state.event.synchronize()",
    ),
    ("colored-formatter.log", "EngineCore encountered", "EngineCore", None, "ERROR", None, "<stdin>:16", "EngineCore encountered a fatal error."),
    ("normal.log", '"GET /health HTTP/1.1" 200 OK', None, None, None, None, None, "INFO:     127.0.0.1:"),
]


@pytest.mark.parametrize("fixture,pick,process,pid,level,stamp,location,message", CASES, ids=[c[1][:30] for c in CASES])
def test_real_lines(fixture, pick, process, pid, level, stamp, location, message):
    raw = _line(fixture, pick)
    line = parse_line(raw)
    assert line.process == process
    if pid is not None:
        assert line.pid == pid
    if process is not None:
        assert isinstance(line.pid, int) and f"pid={line.pid})" in raw
    if level is not None:
        assert line.level == level
    if stamp is not None:
        assert line.stamp == stamp
    if location is not None:
        assert line.location == location
    if message is not None:
        assert line.message.startswith(message)
    assert "\x1b" not in line.text and not line.text.endswith(("\r", "\n"))


def test_multiline_record_lines_share_one_header():
    raws = (FIXTURES / "crash.log").read_text().splitlines()
    worker = [parse_line(r) for r in raws if "[multiproc_executor.py:1063]" in r]
    assert len(worker) > 10
    assert len({w.header for w in worker}) == 1
    assert worker[0].header == ("ERROR", worker[0].stamp, "multiproc_executor.py:1063")


def test_header_without_process_prefix_and_logging_prefix():
    plain = parse_line("INFO 09-13 10:41:07 [core.py:133] Initializing a V1 LLM engine")
    assert (plain.process, plain.level, plain.stamp) == (None, "INFO", "09-13 10:41:07")
    assert plain.message == "Initializing a V1 LLM engine"
    # VLLM_LOGGING_PREFIX puts text before the prefix
    prefixed = parse_line("node-3 (EngineCore pid=7) ERROR 09-13 10:41:07 [core.py:1512] boom")
    assert (prefixed.process, prefixed.pid, prefixed.message) == ("EngineCore", 7, "boom")
    # a message that merely quotes a prefix is not a line of that process
    quoted = parse_line("see (EngineCore pid=7) above")
    assert quoted.process is None and quoted.message == "see (EngineCore pid=7) above"


UTC = UTC


@pytest.mark.parametrize(
    "stamp,reference,expected",
    [
        ("09-13 10:41:07", datetime(2026, 11, 30, 12, 0, tzinfo=UTC), datetime(2026, 9, 13, 10, 41, 7, tzinfo=UTC)),
        # a December line read just after new year belongs to the year before
        ("12-31 23:59:59", datetime(2027, 1, 1, 0, 30, tzinfo=UTC), datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)),
        # a stamp slightly ahead of the reference (clock skew) stays in its year
        ("11-30 15:00:00", datetime(2026, 11, 30, 14, 0, tzinfo=UTC), datetime(2026, 11, 30, 15, 0, tzinfo=UTC)),
        # 02-29 read in a year without it: the year before, if it had one
        ("02-29 08:00:00", datetime(2025, 3, 1, tzinfo=UTC), datetime(2024, 2, 29, 8, 0, tzinfo=UTC)),
        ("02-29 08:00:00", datetime(2026, 3, 1, tzinfo=UTC), None),
        ("02-29 08:00:00", datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 2, 29, 8, 0, tzinfo=UTC)),
        ("13-45 10:00:00", datetime(2026, 1, 1, tzinfo=UTC), None),
    ],
)
def test_year_is_inferred_from_the_reference(stamp, reference, expected):
    assert parse_timestamp(stamp, reference) == expected


def test_timestamp_keeps_the_reference_time_zone():
    tz = timezone(timedelta(hours=2))
    value = parse_timestamp("09-13 10:41:07", datetime(2026, 10, 1, tzinfo=tz))
    assert value is not None and value.utcoffset() == timedelta(hours=2)
    assert value.timestamp() == datetime(2026, 9, 13, 8, 41, 7, tzinfo=UTC).timestamp()


@given(st.text())
def test_parse_line_never_raises(text):
    line = parse_line(text)
    assert isinstance(line.message, str)


@given(st.text(max_size=20), st.datetimes(min_value=datetime(1900, 1, 1)))
def test_parse_timestamp_never_raises(stamp, reference):
    parse_timestamp(stamp, reference)
