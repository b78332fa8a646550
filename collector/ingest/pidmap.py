"""Which engine a process belongs to, from the process tree.

A GPU fault names a pid (the kernel's Xid line: ``pid=415``) and NVML lists each GPU's compute
processes; both are vLLM *workers*, children of the engine core, itself a child of the API server
whose pid the recorder's fingerprint carries. Walking a pid's parents up to a known engine pid
routes an Xid to the engine it hit, and learns which GPUs each engine uses when ``gpus:`` is not
configured.

In Kubernetes the pid the kernel and NVML name is the node's, while the recorder carries the
pids its container sees (``vllm serve`` is pid 1 there), so the walk finds nothing; the pid's
cgroup names its pod instead (``collector.cgroup``), and the engine discovered for that pod (or
whose recorder said it runs in it) is the owner, as dcgm-exporter maps a GPU process to its pod.
The ``/proc`` root is a parameter (tests use a fake tree).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from collector.procfs import parent_pid, pod_of_pid

MAX_DEPTH = 8


def owner(pid: int, engine_pids: Mapping[int, str], proc: Path = Path("/proc")) -> str | None:
    """The engine whose known pid is ``pid`` or one of its ancestors, or None."""
    seen = 0
    cur: int | None = pid
    while cur is not None and cur > 1 and seen <= MAX_DEPTH:
        if cur in engine_pids:
            return engine_pids[cur]
        cur = parent_pid(cur, proc)
        seen += 1
    return None


class PidMap:
    """Caches pid -> engine (a pid keeps its engine for its life; misses are retried)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._cache: dict[int, str] = {}
        self._pods: dict[int, str | None] = {}  # pid -> its pod's UID (None: in no pod)

    def engine_of(self, pid: object, engine_pids: Mapping[int, str]) -> str | None:
        if not isinstance(pid, int) or pid <= 1 or not engine_pids:
            return None
        hit = self._cache.get(pid)
        if hit is not None:
            return hit
        found = owner(pid, engine_pids, self.proc)
        if found is not None:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[pid] = found
        return found

    def pod_of(self, pid: object) -> str | None:
        """The UID of the pod ``pid`` runs in (its cgroup), cached for the pid's life; None when
        it is in no pod or gone (not cached: it may be read before the process is seen)."""
        if not isinstance(pid, int) or pid <= 1:
            return None
        if pid in self._pods:
            return self._pods[pid]
        found = pod_of_pid(pid, self.proc)
        if found is None:
            return None
        if len(self._pods) > 10_000:
            self._pods.clear()
        self._pods[pid] = found.pod_uid
        return found.pod_uid
