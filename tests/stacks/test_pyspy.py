"""py-spy's dump parsed from real output (tests/fixtures/stacks, recorded from py-spy 0.4.3 over
tests/stacks/blocked_child.py), its errors translated, and a dump that hangs or cannot run."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from collector.stacks import causes, pyspy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def _fake(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_real_dump_parses_into_named_threads_innermost_first() -> None:
    threads = {t.name: t for t in pyspy.parse_dump((FIXTURES / "blocked-1.json").read_text())}
    assert set(threads) == {"MainThread", "helper-queue", "mover"}
    main = threads["MainThread"]
    assert [f.function for f in main.frames] == ["wait_for_the_engine_lock", "main", "<module>"]
    assert main.frames[0].line == 19 and main.frames[0].file.endswith("/blocked_child.py")
    assert main.frames[0].short == main.frames[0].file  # under no install prefix: kept as it is
    assert not main.active and not main.owns_gil
    assert [f.function for f in threads["helper-queue"].frames[:3]] == ["Condition.wait", "Queue.get", "helper"]
    assert threads["helper-queue"].frames[0].short == "threading.py"  # the stdlib without its prefix


def test_a_native_dump_marks_the_c_frames() -> None:
    threads = {t.name: t for t in pyspy.parse_dump((FIXTURES / "blocked-2-native.json").read_text())}
    main = threads["MainThread"]
    natives = [f for f in main.frames if f.native]
    assert natives and all(f.line == 0 for f in natives)
    assert "PyThread_acquire_lock_timed" in [f.function for f in natives]
    assert [f.function for f in main.python] == ["wait_for_the_engine_lock", "main", "<module>"]


@pytest.mark.parametrize("text", ["", "{}", '{"threads": []}', "[1, 2]", "not json"])
def test_output_that_is_not_a_dump_is_refused(text: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        pyspy.parse_dump(text)


@pytest.mark.parametrize(
    ("fixture", "cause"),
    [
        ("err-permission.txt", causes.DENIED),
        ("err-capabilities.txt", causes.DENIED),  # same uid, fewer capabilities: py-spy says "executable name"
        ("err-gone.txt", causes.GONE),
        ("err-not-python.txt", causes.NOT_PYTHON),
        ("err-native-nonblocking.txt", causes.FAILED),
    ],
)
def test_py_spys_errors_are_translated(fixture: str, cause: str) -> None:
    got, line = causes.translate((FIXTURES / fixture).read_text())
    assert got == cause
    assert line and "\n" not in line and not line.startswith("Error:")


def test_a_native_refusal_is_its_own_cause_when_the_dump_was_native() -> None:
    got, _ = causes.translate("Error: Failed to unwind native stack: no such unwinder\n", native=True)
    assert got == causes.NATIVE


def test_a_missing_binary_is_a_cause_not_a_raise(tmp_path: Path) -> None:
    d = pyspy.dump(None, 1)
    assert (d.ok, d.cause) == (False, causes.PY_SPY_MISSING)
    d = pyspy.dump(str(tmp_path / "nope"), 1)
    assert d.cause == causes.PY_SPY_MISSING and "cannot run" in (d.error or "")
    assert pyspy.find_binary(str(tmp_path / "nope")) is None


def test_a_hung_py_spy_is_killed_at_the_bound(tmp_path: Path) -> None:
    binary = _fake(tmp_path, "sleep 30")
    t0 = time.monotonic()
    d = pyspy.dump(binary, 1, timeout_s=0.5)
    assert time.monotonic() - t0 < 5.0
    assert d.cause == causes.TIMEOUT and "0.5 s" in (d.error or "")


def test_a_py_spy_that_prints_junk_is_bad_output(tmp_path: Path) -> None:
    d = pyspy.dump(_fake(tmp_path, "echo 'not a dump'"), 1)
    assert d.cause == causes.BAD_OUTPUT


def test_the_sidecars_environment_does_not_reach_py_spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLIGHTREC_API_TOKEN", "s3cret")
    out = tmp_path / "env.txt"
    d = pyspy.dump(_fake(tmp_path, f"env > {out}; echo '[]'"), 1)
    assert d.ok and d.threads == []
    assert "s3cret" not in out.read_text()


def test_the_command_is_nonblocking_unless_native() -> None:
    assert "--nonblocking" in pyspy.command("py-spy", 5, native=False)
    cmd = pyspy.command("py-spy", 5, native=True)
    assert "--native" in cmd and "--nonblocking" not in cmd  # py-spy refuses the two together
