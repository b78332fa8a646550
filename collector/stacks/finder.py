"""The engine's processes on this node: the API server, its engine core(s), their workers.

The recorder tells the sidecar two pids of an engine (its fingerprint: ``server_pid``, the API
server's, and ``engine_core_pid``), as the engine's own pid namespace numbers them. The sidecar
may see another numbering (a DaemonSet with ``hostPID``, compose with ``pid: host``: ``vllm
serve`` is pid 1 in its container and 48213 on the node), so each pid is looked up by the pid a
process sees itself as (``NSpid``'s last field). Where several processes share it (every
container has a pid 1), the one that maps the engine's ring file (``{engine}.{role}.{pid}.ring``
in the recorder folder, the same file, so the same device and inode, on both sides) is it.
From the API server down, the process tree gives the engine core and the workers
(``collector.stacks.roles`` names each by its title).

A process that cannot be told apart, or an engine whose pids nobody reported, is data (``Found.
reason``), never an exception.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.channel.naming import parse_ring_file_name
from collector.stacks import proc as procfs
from collector.stacks import roles

MAX_PROCESSES = 64  # an engine's tree past this is cut (TP/PP 8 x 8 fits), and says so


@dataclass(frozen=True, slots=True)
class EngineProcess:
    pid: int  # as the sidecar sees it (what py-spy is given)
    own_pid: int  # as the process sees itself (what the engine's logs and recorder say)
    ppid: int
    role: str
    title: str
    uid: int | None
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    os_state: str = ""  # the kernel's letter when found (T: stopped, D: in the kernel)
    cap_prm: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "own_pid": self.own_pid,
            "ppid": self.ppid,
            "role": self.role,
            "title": self.title,
            "uid": self.uid,
            "os_state": self.os_state or None,
        }


@dataclass
class Found:
    processes: list[EngineProcess] = field(default_factory=list)
    reason: str | None = None  # why none were found (one line)
    notes: list[str] = field(default_factory=list)


def seeds_of(fingerprint: Mapping[str, Any]) -> dict[str, int]:
    """The pids the recorder reported: ``{"server": pid, "engine_core": pid}`` (those known)."""
    out: dict[str, int] = {}
    for role, keys in (("server", ("server_pid",)), ("engine_core", ("engine_core_pid",))):
        for key in keys:
            v = fingerprint.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out[role] = v
                break
    # a fingerprint written by the engine core alone: its own pid is the engine core's
    pid = fingerprint.get("pid")
    if "engine_core" not in out and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and pid != out.get("server"):
        out["engine_core"] = pid
    return out


def ring_files(recorder_dir: Path, engine: str, pids: set[int], server_pid: int | None) -> dict[int, list[tuple[tuple[int, int], int]]]:
    """The ring files the engine's processes write, by the writer's own pid: ``{pid: [(dev, inode)]}``.
    A ring is the engine's when its name is the engine's (``FLIGHTREC_ENGINE_NAME``) or the
    recorder's default (``vllm-<server_pid>``, with ``/dpN`` after the first DP engine)."""
    names = {engine}
    if server_pid is not None:
        names.add(f"vllm-{server_pid}")
    out: dict[int, list[tuple[tuple[int, int], int]]] = {}
    try:
        entries = list(recorder_dir.iterdir())
    except OSError:
        return out
    for path in entries:
        ring = parse_ring_file_name(path.name)
        if ring is None or ring.pid not in pids or ring.engine.split("/dp", 1)[0] not in names and ring.engine not in names:
            continue
        fid = procfs.file_id(path)
        if fid is not None:
            out.setdefault(ring.pid, []).append(fid)
    return out


def resolve(
    own_pid: int,
    table: Mapping[int, procfs.ProcInfo],
    rings: list[tuple[tuple[int, int], int]],
    proc: Path,
) -> tuple[procfs.ProcInfo | None, str | None]:
    """The process that sees itself as ``own_pid``; ``(None, why)`` when none or several."""
    candidates = [p for p in table.values() if p.own_pid == own_pid]
    if rings and candidates:
        # the ring file decides: True maps it, False does not (another container's pid 1),
        # None may not be read (then the ring cannot rule it out)
        state = {c.pid: _maps_any(c.pid, rings, proc) for c in candidates}
        mapped = [c for c in candidates if state[c.pid] is True]
        if len(mapped) == 1:
            return mapped[0], None
        candidates = [c for c in candidates if state[c.pid] is not False] if not mapped else mapped
    if len(candidates) == 1:
        return candidates[0], None
    if not candidates:
        return (
            None,
            f"no process sees itself as pid {own_pid} here: the sidecar does not see the engine's processes "
            "(run it in the node's pid namespace: hostPID / pid: host)",
        )
    same = [c for c in candidates if c.pid == own_pid]
    if len(same) == 1 and not rings:
        return same[0], None
    return None, (
        f"{len(candidates)} processes see themselves as pid {own_pid} (one per container) and none could be told apart by the "
        "engine's ring file: reading their memory maps needs the same permission as reading their stacks"
    )


def _maps_any(pid: int, rings: list[tuple[tuple[int, int], int]], proc: Path) -> bool | None:
    states = [procfs.maps_file(pid, dev, ino, proc) for dev, ino in rings]
    if any(s is True for s in states):
        return True
    return None if any(s is None for s in states) else False


def find(
    engine: str,
    fingerprint: Mapping[str, Any],
    *,
    recorder_dir: Path | None,
    proc: Path = procfs.PROC,
    max_processes: int = MAX_PROCESSES,
) -> Found:
    seeds = seeds_of(fingerprint)
    if not seeds:
        return Found(reason="the engine's processes are not known: no in-engine recorder reported their pids (install it in vLLM's environment)")
    rings = ring_files(recorder_dir, engine, set(seeds.values()), seeds.get("server")) if recorder_dir is not None else {}
    table = procfs.scan(proc)
    found: dict[str, procfs.ProcInfo] = {}
    why: list[str] = []
    for role, pid in seeds.items():
        p, reason = resolve(pid, table, rings.get(pid, []), proc)
        if p is not None:
            found[role] = p
        elif reason:
            why.append(reason)
    root = found.get("server") or found.get("engine_core")
    if root is None:
        return Found(reason=why[0] if why else "the engine's processes are gone")
    out = Found(notes=list(dict.fromkeys(why)))
    if root.pid != root.own_pid:
        out.notes.append(f"the engine's processes run in their own pid namespace: its pid {root.own_pid} is {root.pid} here")
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    order: list[procfs.ProcInfo] = []
    seen: set[int] = set()
    queue = deque([root] + ([found["engine_core"]] if "engine_core" in found and found["engine_core"] is not root else []))
    while queue:
        p = queue.popleft()
        if p.pid in seen:
            continue
        seen.add(p.pid)
        if len(order) >= max_processes:
            out.notes.append(f"the engine's process tree has more than {max_processes} processes: the first {max_processes} are listed")
            break
        order.append(p)
        queue.extend(table[c] for c in sorted(children.get(p.pid, [])) if c in table)
    server = found.get("server")
    for p in order:
        role, title = roles.role_of(p.cmdline, p.name, is_server=server is not None and p.pid == server.pid)
        out.processes.append(
            EngineProcess(
                pid=p.pid,
                own_pid=p.own_pid,
                ppid=p.ppid,
                role=role,
                title=title,
                uid=p.uid,
                uids=p.uids,
                gids=p.gids,
                os_state=p.state,
                cap_prm=p.cap_prm,
            )
        )
    out.processes.sort(key=lambda e: (roles.ORDER.get(e.role, 9), e.title, e.pid))
    for e in out.processes:
        said = OS_STATES.get(e.os_state)
        if said and e.role in roles.DUMPED:
            out.notes.append(f"{e.role} {e.pid} {said}")
    return out


# What the kernel's state of a process says of a hang (``/proc/PID/status``, ``State:``).
OS_STATES = {
    "T": "is stopped (SIGSTOP, or a debugger): it cannot step until it is continued (SIGCONT)",
    "t": "is stopped by a tracer (a debugger holds it)",
    "D": "is in uninterruptible sleep: waiting inside the kernel (a driver or file system call)",
    "Z": "has exited and not been reaped (a zombie)",
}
