"""Every failure the command line can meet ends in one line on stderr and a conventional
exit code (see collector/cli/common.py), never a traceback; read-only commands create nothing."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from collector.cli import build_parser, main
from collector.sources.base import SourceUnsupported
from collector.sources.supervisor import SupervisedSource

ROOT = Path(__file__).resolve().parents[2]
CRASH_LOG = ROOT / "tests" / "fixtures" / "vllm-logs" / "crash.log"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("FLIGHTREC_"):
            monkeypatch.delenv(key)


def flightrec(*args: str, cwd: Path, stdin: bytes | None = None, shell_tail: str = "") -> subprocess.CompletedProcess[bytes]:
    """The real console entry in a child process: exit codes, stderr and pipes as a shell sees them."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "collector.cli", *args]
    if shell_tail:
        line = " ".join(f"'{c}'" for c in cmd) + shell_tail
        return subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True, input=stdin, timeout=120)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, input=stdin, timeout=120)


def one_line(err: bytes) -> str:
    text = err.decode()
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def upgraded(tmp_path: Path) -> str:
    db = f"sqlite:///{tmp_path / 'f.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    return db


def store_one(db: str) -> int:
    from tests.cli.test_cli import store_one as store

    return store(db)


# -- read-only commands create nothing ------------------------------------------------------


def test_snapshots_list_in_an_empty_folder_names_db_and_creates_nothing(tmp_path: Path) -> None:
    r = flightrec("snapshots", "list", cwd=tmp_path)
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith("flightrec: no database at flightrec.db") and "--db" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["snapshots", "list"], ["snapshots", "show", "1"], ["db", "current"], ["db", "downgrade", "base"]])
def test_a_missing_database_folder_is_not_created(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "nonexistent" / "x.db"
    assert main([*argv, "--db", f"sqlite:///{target}"]) == 2
    assert "--db" in capsys.readouterr().err
    assert not target.parent.exists()


def test_a_database_without_our_tables_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("create table t (x int)").connection.commit()
    assert main(["snapshots", "list", "--db", f"sqlite:///{other}"]) == 2
    assert "no flightrec tables" in capsys.readouterr().err


# -- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "-1", "x"])
def test_limit_below_one_is_a_usage_error(tmp_path: Path, limit: str) -> None:
    r = flightrec("snapshots", "list", "--limit", limit, "--db", f"sqlite:///{tmp_path / 'f.db'}", cwd=tmp_path)
    assert r.returncode == 2
    assert "argument --limit" in r.stderr.decode() and "Traceback" not in r.stderr.decode()


def test_downgrade_without_a_revision_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = upgraded(tmp_path)
    capsys.readouterr()
    assert main(["db", "downgrade", "--db", db]) == 2
    assert "drops every table" in capsys.readouterr().err
    assert main(["db", "current", "--db", db]) == 0
    assert "revision base" not in capsys.readouterr().out  # nothing was dropped
    assert main(["db", "downgrade", "--yes", "--db", db]) == 0
    assert "revision base" in capsys.readouterr().out


def test_verbose_after_the_subcommand_is_accepted() -> None:
    args = build_parser().parse_args(["serve", "-v", "--port", "0"])
    assert args.verbose == 1 and args.func.__name__ == "run_serve"
    assert build_parser().parse_args(["-v", "serve"]).verbose == 1


def _options(parser: argparse.ArgumentParser, path: str = "flightrec") -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out.extend(_options(child, f"{path} {name}"))
        else:
            out.append((path, action))
    return out


def test_every_option_has_help_and_every_help_shows_defaults() -> None:
    parser = build_parser()
    options = _options(parser)
    assert len(options) > 30
    for path, action in options:
        assert action.help, f"{path} {action.option_strings or action.dest} has no help"
    for cmd in (["snapshots", "list"], ["db", "downgrade"], ["demo"], ["inspect-log"]):
        text = subprocess.run(
            [sys.executable, "-m", "collector.cli", *cmd, "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=True,
        ).stdout
        assert text.startswith(f"usage: flightrec {' '.join(cmd)}"), text[:80]
    lst = subprocess.run(
        [sys.executable, "-m", "collector.cli", "snapshots", "list", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    assert "(default: 20)" in " ".join(lst.split())
    for cmd in (["serve"], ["demo"], ["replay"], ["simulate"], ["snapshots", "list"]):
        text = " ".join(
            subprocess.run(
                [sys.executable, "-m", "collector.cli", *cmd, "--help"],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                check=True,
            ).stdout.split()
        )
        assert "(default: None)" not in text, (cmd, text)  # a default the settings give is said once, by the help


# -- the sidecar's start ---------------------------------------------------------------------


def test_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = flightrec("serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'f.db'}", cwd=tmp_path)
    assert r.returncode == 1
    assert one_line(r.stderr) == f"flightrec: cannot serve on 127.0.0.1:{port}: the port is in use (pick another with --port)"


@pytest.mark.parametrize("where", ["/proc/flightrec/x.db", "/proc/x.db", "{tmp}/afile/x.db", "{tmp}"])
def test_an_unwritable_sqlite_path_exits_2(tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("")
    path = where.format(tmp=tmp_path)
    r = flightrec("serve", "--port", "0", "--db", f"sqlite:///{path}", cwd=tmp_path)
    assert r.returncode == 2
    assert one_line(r.stderr).startswith(f"flightrec: database: cannot write {path}")


def test_db_upgrade_says_one_line_without_alembic_noise(tmp_path: Path) -> None:
    r = flightrec("db", "upgrade", "-v", "--db", f"sqlite:///{tmp_path / 'f.db'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"database at revision \d{4}", r.stdout.decode().strip()), r.stdout
    assert "alembic" not in r.stderr.decode().lower()


def test_an_unsupported_source_warns_what_is_lost(caplog: pytest.LogCaptureFixture) -> None:
    class NoNvml:
        name = "nvml"

        async def run(self, sink: object) -> None:
            raise SourceUnsupported("nvmlInit: NVML Shared Library Not Found")

    with caplog.at_level(logging.INFO, logger="collector.sources.supervisor"):
        asyncio.run(SupervisedSource(NoNvml()).run(None))  # type: ignore[arg-type]
    [rec] = [r for r in caplog.records if "unsupported" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    assert rec.getMessage().startswith("nvml unsupported: GPU and Xid capture off")


# -- export ---------------------------------------------------------------------------------


def test_export_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    db = upgraded(tmp_path)
    sid = store_one(db)
    r = flightrec("snapshots", "export", str(sid), "-o", str(tmp_path / "missing" / "x.json.gz"), "--db", db, cwd=tmp_path)
    assert r.returncode == 1
    assert one_line(r.stderr).startswith(f"flightrec: cannot write {tmp_path / 'missing' / 'x.json.gz'}: No such file")


def test_export_dash_writes_gzip_to_stdout(tmp_path: Path) -> None:
    import json

    db = upgraded(tmp_path)
    sid = store_one(db)
    r = flightrec("snapshots", "export", str(sid), "-o", "-", "--db", db, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(gzip.decompress(r.stdout))["id"] == sid
    assert not (tmp_path / "-").exists()


def test_show_into_a_closed_pipe_is_silent(tmp_path: Path) -> None:
    db = upgraded(tmp_path)
    sid = store_one(db)
    r = flightrec("snapshots", "show", str(sid), "--db", db, cwd=tmp_path, shell_tail=" | head -c 1 >/dev/null")
    assert r.stderr.decode() == ""
    assert r.returncode in (0, 141)  # 141 when show was still writing as head left


# -- inspect-log ----------------------------------------------------------------------------


def test_inspect_log_reads_stdin(tmp_path: Path) -> None:
    r = flightrec("inspect-log", "-", "--json", cwd=tmp_path, stdin=CRASH_LOG.read_bytes())
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["path"] == "<stdin>" and doc["counts"].get("cuda_error", 0) >= 1


def test_inspect_log_reads_gzip_by_its_magic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "engine.log.1"  # rotated, compressed, no .gz in its name
    packed.write_bytes(gzip.compress(CRASH_LOG.read_bytes()))
    assert main(["inspect-log", str(packed)]) == 0
    out = capsys.readouterr().out
    assert "cuda_error" in out and "Found no events" not in out


@pytest.mark.parametrize("content", [bytes(range(256)) * 40, b"\x7fELF\x02\x01\x01\x00" + os.urandom(4000)])
def test_inspect_log_refuses_binary(tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    blob = tmp_path / "core"
    blob.write_bytes(content)
    assert main(["inspect-log", str(blob)]) == 2
    assert capsys.readouterr().err.strip() == f"flightrec inspect-log: {blob} is not a text log"


def test_inspect_log_of_a_torn_gzip_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torn = tmp_path / "engine.log.gz"
    torn.write_bytes(gzip.compress(CRASH_LOG.read_bytes())[:-40])
    assert main(["inspect-log", str(torn)]) == 2
    assert "cannot read" in capsys.readouterr().err


# -- health ---------------------------------------------------------------------------------


def test_health_follows_the_configured_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"status": "degraded"}).encode()
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = tmp_path / "flightrec.yaml"
        config.write_text(f"port: {port}\nhost: 0.0.0.0\napi_token: t\n")
        assert main(["health", "--config", str(config)]) == 0
        assert capsys.readouterr().out.strip() == f"http://127.0.0.1:{port}/healthz: degraded"
    finally:
        server.shutdown()
        server.server_close()
    assert main(["health", "--config", str(config)]) == 1  # nothing listens any more
    assert capsys.readouterr().err.startswith(f"flightrec: http://127.0.0.1:{port}/healthz:")


def test_the_sidecars_own_log_lines_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from collector.cli import setup_logging

    setup_logging(0, False)
    try:
        logging.getLogger("collector.snapshot.committer").critical(
            "SNAPSHOT LOST at stop: trigger manual: %r", "reason password: hunter2 at redis://u:Pa55@cache"
        )
        logging.getLogger("collector.cli.serve").info("serving on %s", "http://127.0.0.1:1")
    finally:
        logging.getLogger().handlers[:] = []
    err = capsys.readouterr().err
    assert "hunter2" not in err and "Pa55" not in err, err
    assert "SNAPSHOT LOST at stop" in err and "u:***@cache" in err and "serving on http://127.0.0.1:1" in err


# -- the edges a new user met ---------------------------------------------------------------


def test_an_unknown_revision_is_one_line_exit_2_and_leaves_no_database(tmp_path: Path) -> None:
    target = tmp_path / "new.db"
    r = flightrec("db", "upgrade", "bogusrev", "--db", f"sqlite:///{target}", cwd=tmp_path)
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "bogusrev" in line and "head, base" in line
    assert not target.exists()
    db = upgraded(tmp_path)
    r = flightrec("db", "downgrade", "bogusrev", "--db", db, cwd=tmp_path)
    assert r.returncode == 2 and "bogusrev" in one_line(r.stderr)


def test_replay_takes_verbose_after_the_subcommand_and_plan_json_is_json(tmp_path: Path, demo_run: Any) -> None:
    import json

    args = build_parser().parse_args(["replay", "--plan", "1", "-v"])
    assert args.verbose == 1 and args.plan and args.id == 1
    r = flightrec("replay", "--plan", "1", "-v", "--json", "--db", demo_run.db, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["source"]["id"] == 1 and plan["crashed"] is True
    assert [p["concurrency"] for p in plan["phases"]] == [1, 2, 4, 8, 16]  # the demo's ramp
    assert plan["phases"][plan["crash_phase"] - 1]["fault"] is True
    assert len(plan["planned"]) == plan["requests"] and "id" not in plan["planned"][0]


def test_a_postgres_error_has_no_sqlalchemy_background_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "list", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flightrec:") and "Background on this error" not in err and "sqlalche.me" not in err, err


def test_storage_errors_drop_sqlalchemys_trailing_lines() -> None:
    from collector.storage.connect import StorageError

    raw = (
        '(psycopg.errors.UndefinedTable) relation "x" does not exist\n[SQL: SELECT * FROM x\nWHERE y = %(y)s]\n'
        "[parameters: {'y': 'secret'}]\n(Background on this error at: https://sqlalche.me/e/20/f405)"
    )
    assert str(StorageError(raw)) == '(psycopg.errors.UndefinedTable) relation "x" does not exist'
