"""The node's processes as ``/proc`` shows them: pure parsers of its files, and the reads.

What the stacks need of a process: its parent (the process tree under the API server), its
title (vLLM names its processes ``VLLM::EngineCore``, ``VLLM::Worker_TP0``), its uids (whether
the sidecar may read it), its pids in every pid namespace (``NSpid``: the recorder writes the
pid its container sees, the sidecar with ``hostPID`` sees the node's), and, to tell two
containers' pid 1 apart, whether it maps a given ring file (``maps``: device and inode).

The root is a parameter (``proc``): tests give a fake tree. A process that is gone or unreadable
between two reads is simply not there: every read returns None rather than raising.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int  # as the sidecar's /proc numbers it
    ppid: int
    name: str  # comm (15 characters at most; setproctitle sets it too)
    cmdline: tuple[str, ...]
    uid: int | None  # effective uid; None when unreadable
    nspid: tuple[int, ...]  # outermost (this /proc's) first, the process's own view last
    uids: tuple[int, ...] = ()  # real, effective, saved, filesystem
    gids: tuple[int, ...] = ()
    state: str = ""  # the kernel's letter: R running, S sleeping, D uninterruptible, T stopped, Z zombie
    cap_prm: int | None = None  # permitted capabilities (a reader must hold them all, or CAP_SYS_PTRACE)

    @property
    def own_pid(self) -> int:
        """The pid the process itself sees (what a recorder inside it wrote)."""
        return self.nspid[-1] if self.nspid else self.pid

    @property
    def title(self) -> str:
        """The command line as ``ps`` shows it (a title set by setproctitle replaces argv)."""
        return " ".join(a for a in self.cmdline if a) or f"[{self.name}]"


@dataclass(frozen=True, slots=True)
class Status:
    state: str = ""
    name: str = ""
    ppid: int = 0
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    nspid: tuple[int, ...] = ()
    cap_eff: int | None = None
    cap_prm: int | None = None


def parse_status(text: str) -> Status:
    """The fields of a ``/proc/PID/status`` text the stacks need::

    Name:	python3
    State:	T (stopped)
    PPid:	4021
    Uid:	1000	1000	1000	1000
    Gid:	1000	1000	1000	1000
    NSpid:	41873	1
    CapPrm:	00000000a80425fb
    CapEff:	00000000a80425fb
    """
    name, ppid, state = "", 0, ""
    caps: dict[str, int | None] = {"CapEff": None, "CapPrm": None}
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    nspid: tuple[int, ...] = ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key == "Name":
            name = value
        elif key == "State":
            state = value[:1]
        elif key == "PPid":
            ppid = _int(value) or 0
        elif key == "Uid":
            uids = _ints(value)
        elif key == "Gid":
            gids = _ints(value)
        elif key == "NSpid":
            nspid = _ints(value)
        elif key in caps:
            try:
                caps[key] = int(value, 16)
            except ValueError:
                caps[key] = None
    return Status(state, name, ppid, uids, gids, nspid, caps["CapEff"], caps["CapPrm"])


def _ints(value: str) -> tuple[int, ...]:
    return tuple(n for n in (_int(v) for v in value.split()) if n is not None)


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """argv from ``/proc/PID/cmdline`` (NUL-separated). A title set by setproctitle may be padded
    with NULs or spaces: empty trailing items go."""
    parts = raw.decode("utf-8", "replace").split("\0")
    while parts and not parts[-1].strip():
        parts.pop()
    return tuple(parts)


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated ``KEY=value``) as a dict; items without ``=`` go."""
    out: dict[str, str] = {}
    for item in raw.decode("utf-8", "replace").split("\0"):
        key, sep, value = item.partition("=")
        if sep and key:
            out[key] = value
    return out


def maps_inode(text: str, dev: tuple[int, int], inode: int) -> bool:
    """Whether a ``/proc/PID/maps`` text maps the file with device ``(major, minor)`` and ``inode``::

    7f2c5a000000-7f2c5a400000 rw-s 00000000 00:1a 3071   /dev/shm/flightrec/decode-0.stats.1.ring
    """
    want_dev = f"{dev[0]:02x}:{dev[1]:02x}"
    want_ino = str(inode)
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) >= 5 and fields[4] == want_ino and _same_dev(fields[3], want_dev):
            return True
    return False


def _same_dev(field: str, want: str) -> bool:
    major, _, minor = field.partition(":")
    w_major, _, w_minor = want.partition(":")
    try:
        return int(major, 16) == int(w_major, 16) and int(minor, 16) == int(w_minor, 16)
    except ValueError:
        return False


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


# -- reads -------------------------------------------------------------------------------------
def read_process(pid: int, proc: Path = PROC) -> ProcInfo | None:
    base = proc / str(pid)
    try:
        status = (base / "status").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        cmdline = parse_cmdline((base / "cmdline").read_bytes())
    except OSError:
        cmdline = ()
    st = parse_status(status)
    return ProcInfo(
        pid=pid,
        ppid=st.ppid,
        name=st.name,
        cmdline=cmdline,
        uid=st.uids[1] if len(st.uids) > 1 else None,
        nspid=st.nspid or (pid,),
        uids=st.uids,
        gids=st.gids,
        state=st.state,
        cap_prm=st.cap_prm,
    )


def pids(proc: Path = PROC) -> list[int]:
    try:
        return sorted(int(p.name) for p in proc.iterdir() if p.name.isascii() and p.name.isdigit())
    except OSError:
        return []


def scan(proc: Path = PROC, only: Iterable[int] | None = None) -> dict[int, ProcInfo]:
    """Every process this ``/proc`` shows (or those of ``only``), by pid."""
    out: dict[int, ProcInfo] = {}
    for pid in pids(proc) if only is None else only:
        info = read_process(pid, proc)
        if info is not None:
            out[pid] = info
    return out


def read_environ(pid: int, proc: Path = PROC) -> dict[str, str] | None:
    """The process's environment at its start, or None when it may not be read (another uid
    without CAP_SYS_PTRACE: the same check as reading its memory)."""
    try:
        return parse_environ((proc / str(pid) / "environ").read_bytes())
    except OSError:
        return None


def maps_file(pid: int, dev: tuple[int, int], inode: int, proc: Path = PROC) -> bool | None:
    """Whether the process maps that file; None when its maps may not be read."""
    try:
        return maps_inode((proc / str(pid) / "maps").read_text(errors="replace"), dev, inode)
    except OSError:
        return None


def file_id(path: Path) -> tuple[tuple[int, int], int] | None:
    """``((major, minor), inode)`` of a file, as ``maps`` names it; None when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino
