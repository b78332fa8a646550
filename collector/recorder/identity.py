"""Internal: who writes a ring: the facts that let the sidecar join a recorder to the engine it watches.

An engine is reached through its API server, so the identity is the API server's: its pid (the
same in the stat logger and in the engine core, so both halves of a step meet), and where it
listens (``server_host``/``server_port``, matched by the sidecar against its configured URLs).
``name`` is the ``FLIGHTREC_ENGINE_NAME`` override; without it the engine is
``vllm-<server_pid>`` and DP engines after the first get ``/dp<index>``.

Under Kubernetes the identity also says which pod the engine runs in (``pod_uid``): the
downward API's ``FLIGHTREC_POD_UID``, else the pod segment of the process's own cgroup
(``collector.cgroup``; a container in a cgroup namespace of its own sees ``/`` there, so
the downward API is the reliable one). The sidecar joins the rings to the pod it discovered by
that UID, whatever the engine's name or port.

``run`` tells one run of the engine from the next: the API server's start time in milliseconds
since the epoch (``process_start_ms``), which both writing processes (the API server's stat
logger and the engine core's scheduler) read alike, so the two halves of a step still meet. Pids
repeat across restarts (a container's own pid namespace, a simulator); a start time does not.
It names the ring files and rides in their meta record and the fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.cgroup import pod_of_cgroup
from collector.recorder.env import engine_name_from_env, pod_uid_from_env

SELF_CGROUP = Path("/proc/self/cgroup")


def own_pod_uid(cgroup_file: Path = SELF_CGROUP) -> str | None:
    """The pod this process runs in, from its own cgroup; None outside a pod or where the path
    does not say (never raises: the engine must start whatever is read here)."""
    try:
        found = pod_of_cgroup(cgroup_file.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    return found.pod_uid if found is not None else None


def engine_name(base: str | None, engine_index: int, server_pid: int) -> str:
    """The ring's engine name: ``base`` (the override) or ``vllm-<server_pid>``, plus ``/dp<i>``
    for engine indexes after the first."""
    name = base or f"vllm-{server_pid}"
    return name if engine_index == 0 else f"{name}/dp{engine_index}"


def process_start_ms(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """When process ``pid`` started, in milliseconds since the epoch, from ``/proc``: the boot
    time (``btime`` of ``/proc/stat``) plus the process's ``starttime`` (field 22 of
    ``/proc/<pid>/stat``, clock ticks since boot). None where ``/proc`` does not say. Read once
    per recorder start: two small reads."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
        # the command name (field 2) may hold spaces and parentheses: count from its last ")"
        fields = stat[stat.rindex(b")") + 2 :].split()
        ticks = int(fields[19])  # field 22 of the whole line
        btime = next(int(line.split()[1]) for line in (proc / "stat").read_bytes().splitlines() if line.startswith(b"btime "))
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime * 1000 + ticks * 1000 // max(hz, 1)


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    """One engine as its recorder names it (a simulator fills this in as vLLM's adapter does)."""

    server_pid: int
    engine_index: int = 0
    server_host: str | None = None  # None: not known (not "all interfaces")
    server_port: int | None = None
    name: str | None = None  # FLIGHTREC_ENGINE_NAME, when set
    engine_version: str = "unknown"  # vLLM's version, or the simulator's
    pod_uid: str | None = None  # the Kubernetes pod's UID; None outside Kubernetes
    run: int | None = None  # this run of the engine (the module docstring); None: not known

    @classmethod
    def from_env(
        cls,
        *,
        server_pid: int,
        engine_index: int = 0,
        server_host: str | None = None,
        server_port: int | None = None,
        engine_version: str = "unknown",
        environ: Mapping[str, str] | None = None,
        cgroup_file: Path = SELF_CGROUP,
        run: int | None = None,
    ) -> EngineIdentity:
        """The identity with ``FLIGHTREC_ENGINE_NAME`` (from ``environ``, else the process's) as
        the name override, and the pod's UID from ``FLIGHTREC_POD_UID``, else ``cgroup_file``."""
        return cls(
            server_pid=server_pid,
            engine_index=engine_index,
            server_host=server_host,
            server_port=server_port,
            name=engine_name_from_env(environ),
            engine_version=engine_version,
            pod_uid=pod_uid_from_env(environ) or own_pod_uid(cgroup_file),
            run=run,
        )

    @property
    def engine(self) -> str:
        return engine_name(self.name, self.engine_index, self.server_pid)

    def facts(self) -> dict[str, Any]:
        """What the meta record and the fingerprint carry for joining (``run`` when known)."""
        out: dict[str, Any] = {} if self.run is None else {"run": self.run}
        out |= {
            "engine_index": self.engine_index,
            "server_pid": self.server_pid,
            "server_host": self.server_host,
            "server_port": self.server_port,
            "name_from": "FLIGHTREC_ENGINE_NAME" if self.name else "server_pid",
        }
        if self.pod_uid is not None:  # only under Kubernetes
            out["pod_uid"] = self.pod_uid
        return out
