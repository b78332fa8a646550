"""Which API server an engine belongs to: the pid rule of vLLM's process tree and the listening
address read from the server's command line (a fake /proc)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from collector.vllm.server import parse_server_args, read_cmdline, server_identity, server_pid

PY = "/opt/venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host", "127.0.0.1", "--port", "8011"], ("127.0.0.1", 8011)),
        ([PY, "/opt/venv/bin/vllm", "serve", "m", "--port=9000"], (None, 9000)),
        ([PY, "/opt/venv/bin/vllm", "serve", "m"], (None, 8000)),  # vLLM's default port
        ([PY, "/opt/venv/bin/vllm", "serve", "m", "--uds", "/run/v.sock"], (None, None)),
        ([PY, "/opt/venv/bin/vllm", "serve", "--config", "serve.yaml"], (None, None)),  # port in the file
        ([PY, "/opt/venv/bin/vllm", "serve", "m", "--headless"], (None, None)),  # no API server here
        ([PY, "my_launcher.py", "--workers", "2"], (None, None)),  # not vLLM's server: no default
        ([], (None, None)),
    ],
)
def test_parse_server_args(argv: list[str], expected: tuple[str | None, int | None]) -> None:
    assert parse_server_args(argv) == expected


def config(api_process_count: int) -> SimpleNamespace:
    return SimpleNamespace(parallel_config=SimpleNamespace(_api_process_count=api_process_count))


def test_server_pid_follows_vllms_process_tree() -> None:
    # one API server: it started the engine cores, so its own pid is their parent's
    assert server_pid(config(1), in_engine_core=False, pid=100, ppid=1) == 100
    assert server_pid(config(1), in_engine_core=True, pid=101, ppid=100, started_by_parent=True) == 100
    # an engine core inside its client's process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    assert server_pid(config(1), in_engine_core=True, pid=101, ppid=1, started_by_parent=False) == 101
    # several API servers (DP's default): the supervisor started both the engine cores and them
    assert server_pid(config(4), in_engine_core=False, pid=102, ppid=50) == 50
    assert server_pid(config(4), in_engine_core=True, pid=103, ppid=50, started_by_parent=True) == 50
    assert server_pid(SimpleNamespace(), in_engine_core=False, pid=7, ppid=1) == 7


def test_identity_from_the_servers_cmdline(tmp_path: Path) -> None:
    import os

    parent = os.getppid()
    (tmp_path / str(parent)).mkdir()
    (tmp_path / str(parent) / "cmdline").write_bytes(b"\0".join([PY.encode(), b"-m", b"vllm.entrypoints.openai.api_server", b"--port", b"8123", b""]))
    ident = server_identity(config(1), 1, "0.32.0", in_engine_core=True, environ={}, proc=tmp_path, started_by_parent=True)
    assert (ident.server_pid, ident.server_port, ident.server_host, ident.engine) == (parent, 8123, None, f"vllm-{parent}/dp1")
    named = server_identity(
        config(1), 0, "0.32.0", in_engine_core=True, proc=tmp_path, started_by_parent=True, environ={"FLIGHTREC_ENGINE_NAME": "decode-0"}
    )
    assert named.engine == "decode-0" and named.server_port == 8123
    assert read_cmdline(999999999, proc=tmp_path) == []
