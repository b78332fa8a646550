"""The edges a new user hit on the command line (issue: the on-call edges), each as it was met:
a bad flag named wherever it stands, a SQLite URL's slashes explained, an export of unredacted
data written owner-only, a report that cannot write its bundle failing before it prints, a
replay against nothing that says so and fails, and the install line the report gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from collector.cli import main
from tests.cli.test_cli_failures import flightrec, one_line, store_one, upgraded


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("FLIGHTREC_"):
            monkeypatch.delenv(key)


def test_a_bad_flag_before_the_command_is_named(tmp_path: Path) -> None:
    r = flightrec("--bogus", cwd=tmp_path)
    assert r.returncode == 2
    assert "--bogus" in r.stderr.decode() and "arguments are required" not in r.stderr.decode()


def test_no_command_says_a_command_is_needed(tmp_path: Path) -> None:
    r = flightrec(cwd=tmp_path)
    assert r.returncode == 2 and "COMMAND" in r.stderr.decode()


@pytest.mark.parametrize("argv", [["snapshots", "list", "--bogus"], ["report", "1", "--bogus"], ["db", "upgrade", "--bogus"]])
def test_a_bad_flag_after_a_subcommand_shows_that_subcommands_usage(tmp_path: Path, argv: list[str]) -> None:
    r = flightrec(*argv, cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2 and "--bogus" in err
    usage = err.splitlines()[0]
    assert usage.startswith("usage: flightrec " + " ".join(a for a in argv if not a.startswith("-") and not a.isdigit())), err


def test_a_relative_sqlite_path_says_how_to_write_an_absolute_one(tmp_path: Path) -> None:
    r = flightrec("snapshots", "list", "--db", "sqlite:///data/x.db", cwd=tmp_path)
    line = one_line(r.stderr)
    assert r.returncode == 2 and "sqlite:////" in line and "absolute" in line


def test_an_export_is_written_owner_only(tmp_path: Path) -> None:
    db = upgraded(tmp_path)
    sid = store_one(db)
    target = tmp_path / "f"
    old = os.umask(0o022)
    try:
        assert main(["snapshots", "export", str(sid), "--db", db, "-o", str(target)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_report_whose_bundle_cannot_be_written_fails_before_printing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = upgraded(tmp_path)
    sid = store_one(db)
    capsys.readouterr()
    assert main(["report", str(sid), "--db", db, "--bundle", str(tmp_path / "no-such-dir" / "b.tgz")]) != 0
    out, err = capsys.readouterr()
    assert out == "" and "no-such-dir" in err


def test_the_report_installs_what_exists(demo_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "1", "--db", demo_run.db]) == 0
    out = capsys.readouterr().out
    assert "pip install vllm-flight-recorder" not in out  # not on PyPI


def test_a_replay_whose_target_answers_nothing_fails_and_says_so(demo_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["replay", "1", "--db", demo_run.db, "--target", "http://127.0.0.1:1", "--speed", "1000", "--timeout", "2"])
    out = capsys.readouterr().out
    assert rc != 0
    assert "engine died again: yes" not in out
