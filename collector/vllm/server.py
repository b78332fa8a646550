"""Internal: which vLLM API server an engine belongs to: its pid and where it listens, read in the process
the recorder runs in. The sidecar joins a recorder's rings to a configured engine by these.

vLLM 0.32's process tree (``vllm/entrypoints/cli/serve.py``):

- one API server (the default, and every DP setup with ``--api-server-count 1``): the API server
  process itself starts the engine cores (``launch_core_engines``), so the stat logger's own pid
  is the engine core's parent pid;
- several API servers (``--api-server-count N``, which DP with the internal load balancer
  defaults to ``--data-parallel-size``): a supervisor process binds the listening socket and
  starts the engine cores and the N API-server processes; each API server's stat logger then
  takes its parent, the supervisor, as the server (``parallel_config._api_process_count > 1``),
  which is also the engine cores' parent;
- an engine core run inside its client's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as the
  offline ``LLMEngine`` can) is not a child vLLM started for it: its own pid is the server's;
- ``--headless`` engine cores (multi-node DP) have no API server on their node: they are named
  after their launcher and join nothing without ``FLIGHTREC_ENGINE_NAME``.

The port comes from the server's command line (``--port``, vLLM's default 8000 when the command
is vLLM's server and gives none); ``--host`` likewise (None when not given: vLLM then listens on
every interface). A ``--config`` file or a Unix socket (``--uds``) leaves the port unknown.

The run id is the server's start time (``collector.recorder.identity.process_start_ms``): read
from ``/proc`` for the server's pid, it is the same in the stat logger and the engine core.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collector.recorder.identity import EngineIdentity, process_start_ms

VLLM_DEFAULT_PORT = 8000


def server_pid(
    vllm_config: Any,
    *,
    in_engine_core: bool,
    pid: int | None = None,
    ppid: int | None = None,
    started_by_parent: bool | None = None,
) -> int:
    """The pid of the process that owns the engine's API server (see the module docstring).
    ``started_by_parent``: whether this process is a multiprocessing child (vLLM starts engine
    cores and extra API servers that way); found out when None."""
    own = os.getpid() if pid is None else pid
    parent = os.getppid() if ppid is None else ppid
    if started_by_parent is None:
        started_by_parent = multiprocessing.parent_process() is not None
    if in_engine_core:
        return parent if started_by_parent else own
    parallel = getattr(vllm_config, "parallel_config", None)
    count = getattr(parallel, "_api_process_count", 1)
    return parent if isinstance(count, int) and count > 1 else own


def parse_server_args(argv: Sequence[str]) -> tuple[str | None, int | None]:
    """``(host, port)`` from a vLLM server command line (pure)."""
    is_server = any("vllm" in a for a in argv[:3]) and any(a == "serve" or a.endswith("api_server") or a.endswith("api_server.py") for a in argv[:4])
    opts: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            opts[key] = value
        elif arg in ("--host", "--port", "--uds", "--config") and i + 1 < len(argv):
            opts[arg] = argv[i + 1]
            i += 1
        elif arg == "--headless":
            flags.add(arg)
        i += 1
    host = opts.get("--host") or None
    port: int | None = None
    raw = opts.get("--port")
    if raw is not None:
        port = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 5 else None  # "²".isdigit() is true
    elif is_server and not ({"--uds", "--config"} & opts.keys()) and "--headless" not in flags:
        port = VLLM_DEFAULT_PORT
    return host, port


def read_cmdline(pid: int, *, proc: Path = Path("/proc")) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def server_identity(
    vllm_config: Any,
    engine_index: int,
    version: str,
    *,
    in_engine_core: bool,
    environ: Mapping[str, str] | None = None,
    proc: Path = Path("/proc"),
    started_by_parent: bool | None = None,
) -> EngineIdentity:
    pid = server_pid(vllm_config, in_engine_core=in_engine_core, started_by_parent=started_by_parent)
    host, port = parse_server_args(read_cmdline(pid, proc=proc))
    return EngineIdentity.from_env(
        server_pid=pid,
        engine_index=engine_index,
        server_host=host,
        server_port=port,
        engine_version=version,
        environ=environ,
        run=process_start_ms(pid, proc=proc),  # the same in the stat logger and the engine core
    )
