"""Which configured engine a recorder ring belongs to, with no setting on the engine's side.

The in-engine recorder names its rings ``vllm-<API server pid>`` (``/dp<i>`` for DP engine
``i``) unless ``FLIGHTREC_ENGINE_NAME`` says otherwise, and its meta record may carry the API
server's pid and listening port. The sidecar's configuration names engines by URL. They meet
here, in this order:

1. the recorder's name is a configured name (``FLIGHTREC_ENGINE_NAME`` set to it), or
   ``<configured>/dp<i>``;
2. the meta record's ``pod_uid`` (the downward API's, or the recorder's own cgroup) is the UID
   of a pod that Kubernetes discovery follows: whatever the engine's name or port;
3. the meta record's ``server_port`` equals the port of exactly one configured URL on this host;
4. the process listening on a configured URL's port (``/proc/net/tcp*`` -> socket inode ->
   ``/proc/PID/fd``) is the recorder's API server pid (from the meta record, else the ring's
   default name) or one of its ancestors;
5. otherwise the ring keeps the recorder's own name and is marked unconfigured.

Pure reads of ``/proc`` under a root passed in (tests give a fake tree); lookups are cached
for ``ttl`` seconds because scanning every process's fds costs milliseconds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from collector.procfs import parent_pid

_DEFAULT_NAME = re.compile(r"^vllm-(\d{1,10})(?:/dp(\d{1,4}))?$")
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}
_LISTEN = "0A"


@dataclass(frozen=True)
class Joined:
    name: str  # the sidecar's engine name
    configured: bool  # a configured engine (else: steps of an engine nobody configured)
    how: str  # "name", "pod", "port", "listener", "none"


@dataclass(frozen=True)
class _Target:
    name: str
    host: str
    port: int


def _targets(engines: Sequence[Any]) -> list[_Target]:
    out = []
    for eng in engines:
        url = getattr(eng, "url", None)
        if not url:
            continue
        try:
            parts = urlsplit(str(url))
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue
        out.append(_Target(str(eng.name), (parts.hostname or "").lower(), port))
    return out


def listening_pids(port: int, proc: Path = Path("/proc")) -> set[int]:
    """Pids of processes with a TCP socket listening on ``port`` (any address)."""
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            text = (proc / table).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            _, _, hexport = cols[1].rpartition(":")
            try:
                if int(hexport, 16) == port:
                    inodes.add(cols[9])
            except ValueError:
                continue
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    pids: set[int] = set()
    try:
        entries = os.listdir(proc)
    except OSError:
        return pids
    for entry in entries:
        if not (entry.isascii() and entry.isdigit()):
            continue
        fd_dir = proc / entry / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in wanted:
                    pids.add(int(entry))
                    break
            except OSError:
                continue
    return pids


class EngineJoin:
    def __init__(
        self,
        engines: Sequence[Any],
        *,
        proc: Path = Path("/proc"),
        ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.names = {str(e.name) for e in engines}
        self.targets = _targets(engines)
        self.pods: dict[str, str] = {}  # pod UID -> engine name (discovered engines)
        self.proc = proc
        self.ttl = ttl
        self.clock = clock
        self._listeners: dict[int, tuple[float, set[int]]] = {}

    def add(self, engine: Any) -> None:
        """An engine found while running (Kubernetes discovery): its rings join it by name."""
        self.discard(str(engine.name))
        self.names.add(str(engine.name))
        self.targets += _targets([engine])
        uid = getattr(engine, "uid", None)
        if isinstance(uid, str) and uid:
            self.pods[uid.lower()] = str(engine.name)

    def discard(self, name: str) -> None:
        self.names.discard(name)
        self.targets = [t for t in self.targets if t.name != name]
        self.pods = {uid: n for uid, n in self.pods.items() if n != name}

    def _listening(self, port: int) -> set[int]:
        now = self.clock()
        hit = self._listeners.get(port)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        pids = listening_pids(port, self.proc)
        self._listeners[port] = (now, pids)
        return pids

    def _ancestors(self, pid: int) -> list[int]:
        out = [pid]
        for _ in range(8):
            ppid = parent_pid(out[-1], self.proc)
            if ppid is None or ppid <= 1 or ppid in out:
                break
            out.append(ppid)
        return out

    def resolve(self, recorder_name: str, meta: Mapping[str, Any] | None = None) -> Joined:
        meta = meta or {}
        index = meta.get("engine_index")
        m = _DEFAULT_NAME.match(recorder_name)
        if not isinstance(index, int):
            index = int(m.group(2)) if m and m.group(2) else 0
        base, _, dp = recorder_name.partition("/dp")
        if recorder_name in self.names:
            return Joined(recorder_name, True, "name")
        if base in self.names and dp.isdigit():
            return Joined(recorder_name, True, "name")

        def named(target: str) -> str:
            return target if index == 0 else f"{target}/dp{index}"

        pod_uid = meta.get("pod_uid")
        if isinstance(pod_uid, str) and pod_uid.lower() in self.pods:
            return Joined(named(self.pods[pod_uid.lower()]), True, "pod")

        local = [t for t in self.targets if t.host in _LOCAL_HOSTS or t.host == _hostname()]
        port = meta.get("server_port")
        if isinstance(port, int):
            hits = [t for t in local if t.port == port]
            if len(hits) == 1:
                return Joined(named(hits[0].name), True, "port")
        server_pid = meta.get("server_pid")
        if not isinstance(server_pid, int) and m:
            server_pid = int(m.group(1))
        if isinstance(server_pid, int) and server_pid > 1:
            mine = set(self._ancestors(server_pid))
            for t in self.targets:
                if t.host not in _LOCAL_HOSTS and t.host != _hostname():
                    continue
                if self._listening(t.port) & mine:
                    return Joined(named(t.name), True, "listener")
        return Joined(recorder_name, False, "none")


def _hostname() -> str:
    try:
        return os.uname().nodename.lower()
    except OSError:
        return ""
