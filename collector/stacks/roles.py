"""Which part of the engine a process is, from its title (pure).

vLLM names its processes with setproctitle, ``{VLLM_PROCESS_NAME_PREFIX}::{name}`` (prefix
``VLLM`` by default; ``vllm/utils/system_utils.py set_process_title``), which replaces the
command line ``/proc/PID/cmdline`` shows:

    VLLM::EngineCore              the engine core (vllm/v1/engine/core.py)
    VLLM::EngineCore_DP1          a data-parallel engine core
    VLLM::Worker_TP0              a worker of the multiprocess executor (..._PP1_TP0, _DP0_TP1, _EP0)
    VLLM::Worker                  a worker before its parallel groups are set up
    VLLM::APIServer_0             one of several API servers (--api-server-count N)
    VLLM::APIServer_DP0           a DP server of the DP supervisor
    VLLM::DPCoordinator           the DP coordinator

setproctitle sets the thread name (``comm``, 15 characters: ``VLLM::EngineCor``) too; where the
command line could not be rewritten, that name says the role (without the worker's rank).

The single API server keeps its own command line (``vllm serve ...``, ``python -m
vllm.entrypoints.openai.api_server ...``); the recorder names it by its pid.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

API_SERVER = "api_server"
ENGINE_CORE = "engine_core"
WORKER = "worker"
DP_COORDINATOR = "dp_coordinator"
HELPER = "helper"  # a Python process vLLM or torch starts beside the engine (not read)
OTHER = "other"

# the roles whose stacks are read; helpers (resource tracker, compile workers) are listed only
DUMPED = frozenset({API_SERVER, ENGINE_CORE, WORKER, DP_COORDINATOR})
# the order a page lists processes in: where a step runs first
ORDER = {ENGINE_CORE: 0, WORKER: 1, API_SERVER: 2, DP_COORDINATOR: 3, HELPER: 4, OTHER: 5}
# processes whose main thread runs the engine's step (the busy loops): never idle while the
# engine holds requests (collector.stacks.compare)
STEP_ROLES = frozenset({ENGINE_CORE, WORKER})

_TITLE = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]+)::(?P<name>[A-Za-z]+)(?P<suffix>(?:_[A-Za-z]*\d*)*)\s*$")
_BY_NAME = {"EngineCore": ENGINE_CORE, "Worker": WORKER, "APIServer": API_SERVER, "DPCoordinator": DP_COORDINATOR}
_COMM = re.compile(r"^[A-Za-z0-9_.-]+::(?P<name>[A-Za-z]+)")
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "compile_worker", "torch/_inductor")


def vllm_title(cmdline: Sequence[str]) -> tuple[str, str] | None:
    """``(role, title)`` when the command line is a vLLM process title, else None."""
    first = " ".join(a for a in cmdline if a).strip()
    m = _TITLE.match(first)
    if m is None:
        return None
    role = _BY_NAME.get(m.group("name"))
    return (role, first) if role is not None else None


def role_of(cmdline: Sequence[str], name: str, *, is_server: bool = False) -> tuple[str, str]:
    """``(role, title)`` of a process of the engine's tree. ``is_server``: the recorder names
    this pid as the engine's API server."""
    titled = vllm_title(cmdline)
    if titled is not None:
        return titled
    comm = _COMM.match(name)
    if comm is not None:  # the 15 characters of comm: a prefix of the title's name
        role = next((r for n, r in _BY_NAME.items() if n.startswith(comm.group("name")) or comm.group("name").startswith(n)), None)
        if role is not None:
            return role, name
    text = " ".join(cmdline)
    if is_server:
        return API_SERVER, text or name
    if any(h in text for h in _HELPERS):
        return HELPER, text
    if "vllm" in text and ("serve" in cmdline or "api_server" in text):
        return API_SERVER, text
    if name.startswith("python") or (cmdline and "python" in cmdline[0].rsplit("/", 1)[-1]):
        return HELPER, text or name
    return OTHER, text or name
