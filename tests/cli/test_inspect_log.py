"""``flightrec inspect-log``'s main(): text and JSON post-mortems of real logs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from collector.cli.inspect_log import SCHEMA, inspect_log, main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-logs"


def _run(path: Path | str, as_json: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(str(path), as_json, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_json_of_the_real_crash(tmp_path):
    code, out, err = _run(FIXTURES / "crash.log", as_json=True)
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["schema"] == SCHEMA
    text = (FIXTURES / "crash.log").read_text()
    assert doc["lines"] == len(text.splitlines())
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds.index("cuda_error") < kinds.index("crash_dump") < kinds.index("engine_fatal")
    assert kinds.index("engine_fatal") < kinds.index("engine_dead")
    lines = [e["data"]["line"] for e in doc["events"]]
    assert lines == sorted(lines)
    # each event's line number points at its first line in the file
    raw = text.splitlines()
    for e in doc["events"]:
        assert raw[e["data"]["line"] - 1].rstrip("\r") == e["lines"][0][: len(raw[e["data"]["line"] - 1])]
    [dump] = doc["crash_dumps"]
    assert dump["process"] == "EngineCore" and dump["vllm_version"] == "0.32.0"
    assert dump["stats"]["running"] == len(dump["requests"]) > 0
    assert dump["config"]["tensor_parallel_size"] == 1
    stat_lines = [x for x in raw if "Avg prompt throughput" in x]
    assert doc["throughput"]["samples"] == len(stat_lines)
    assert doc["counts"]["cuda_error"] == 1


def test_text_report_of_the_incident():
    code, out, _ = _run(FIXTURES / "incident-decode.log", as_json=False)
    assert code == 0
    assert "Worker_TP0[3107]" in out and "Worker_TP1[3108]" in out
    assert 'File "vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py", line 823' in out
    assert "state.event.synchronize()" in out
    assert out.count("torch.AcceleratorError: CUDA error: unspecified launch failure") >= 4
    assert "2026-09-13 10:41:07" in out or "09-13 10:41:07" in out


def test_text_report_has_the_request_table():
    code, out, _ = _run(FIXTURES / "crash.log", as_json=False)
    assert code == 0
    report = inspect_log(FIXTURES / "crash.log")
    [dump] = report.crash_dumps
    assert "request_id" in out
    for row in dump.data["requests"]:
        line = next(x for x in out.splitlines() if row["request_id"] in x)
        assert str(row["num_computed_tokens"]) in line.split()


def test_year_comes_from_the_file_time(tmp_path):
    log = tmp_path / "old.log"
    log.write_bytes((FIXTURES / "incident-decode.log").read_bytes())
    import os
    from datetime import datetime

    jan = datetime(2031, 1, 5, 12, 0).timestamp()
    os.utime(log, (jan, jan))
    report = inspect_log(log)
    # September stamps read in January belong to the year before
    assert all(datetime.fromtimestamp(e.ts).year == 2030 for e in report.events)


@pytest.mark.parametrize("name", ["missing.log", ""])
def test_missing_file_exits_2(tmp_path, name):
    path = tmp_path / name if name else tmp_path  # a directory is not a log either
    code, out, err = _run(path, as_json=False)
    assert code == 2 and out == ""
    assert err.startswith("flightrec inspect-log: cannot read") and str(path) in err


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    code, out, _ = _run(empty, as_json=True)
    doc = json.loads(out)
    assert code == 0 and doc["events"] == [] and doc["throughput"]["samples"] == 0


def test_a_reader_that_stops_early_is_silent_exit_141():
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    err = io.StringIO()
    # 141 = 128 + SIGPIPE, what `cat big | head` reports for cat: silent, but not success
    assert main(str(FIXTURES / "crash.log"), True, out=ClosedPipe(), err=err) == 141
    assert err.getvalue() == ""
