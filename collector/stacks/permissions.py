"""Whether the sidecar may read another process's memory, decided before py-spy is run (pure,
over what ``/proc`` says).

The kernel's rule for ``process_vm_readv`` and ``ptrace`` (``PTRACE_MODE_ATTACH_REALCREDS``,
kernel/ptrace.c ``__ptrace_may_access``): the caller's real uid and gid equal every uid and gid
of the target (real, effective, saved), or the caller holds ``CAP_SYS_PTRACE``; and
(security/commoncap.c ``cap_ptrace_access_check``) the target's permitted capabilities are a
subset of the caller's, or the caller holds ``CAP_SYS_PTRACE``: a sidecar that runs as root but
drops every capability may not read vLLM running as root with a container's default ones. Then
Yama (``/proc/sys/kernel/yama/ptrace_scope``) may refuse still:

    0  classic: the rule above only
    1  restricted: only a descendant of the reader (py-spy is the sidecar's child, never the
       engine's parent), unless the reader holds CAP_SYS_PTRACE
    2  admin-only: CAP_SYS_PTRACE always needed
    3  no attach: nobody, until a reboot

What cannot be seen here (a seccomp or LSM profile, a process made non-dumpable) shows as
py-spy's refusal (``causes.DENIED``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collector.stacks import causes
from collector.stacks.proc import PROC, ProcInfo, parse_status

CAP_SYS_PTRACE = 19


@dataclass(frozen=True, slots=True)
class Access:
    """The sidecar's own rights to read other processes."""

    uid: int | None  # real
    gid: int | None
    cap_sys_ptrace: bool | None  # None: unknown (CapEff unreadable)
    yama_scope: int | None  # None: no Yama on this kernel
    cap_prm: int | None = None  # permitted


def parse_yama(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def read_access(proc: Path = PROC) -> Access:
    """The reader's rights, from ``/proc/self/status`` and Yama's setting (the root is a
    parameter: tests give a fake one)."""
    try:
        st = parse_status((proc / "self" / "status").read_text())
    except (OSError, UnicodeDecodeError):
        return Access(None, None, None, _yama(proc))
    cap = None if st.cap_eff is None else bool(st.cap_eff >> CAP_SYS_PTRACE & 1)
    return Access(st.uids[0] if st.uids else None, st.gids[0] if st.gids else None, cap, _yama(proc), st.cap_prm)


def _yama(proc: Path) -> int | None:
    try:
        return parse_yama((proc / "sys" / "kernel" / "yama" / "ptrace_scope").read_text())
    except OSError:
        return None


def refusal(access: Access, target: ProcInfo) -> tuple[str, str] | None:
    """``(cause, detail)`` when the kernel will refuse the read, None when it should allow it (or
    cannot be told: py-spy then tries, and its refusal is translated)."""
    cap = access.cap_sys_ptrace
    if access.yama_scope == 3:
        return causes.YAMA_NO_ATTACH, ""
    if cap is False and access.yama_scope == 2:
        return causes.YAMA_ADMIN_ONLY, ""
    if cap is False and access.yama_scope == 1:
        return causes.YAMA_RESTRICTED, ""
    if cap is False and access.uid is not None and target.uids:
        same = all(u == access.uid for u in target.uids[:3]) and (
            not target.gids or access.gid is None or all(g == access.gid for g in target.gids[:3])
        )
        if not same:
            theirs = sorted(set(target.uids[:3]))
            return causes.OTHER_UID, f"the engine's processes run as uid {'/'.join(map(str, theirs))}, the sidecar as uid {access.uid}"
    if cap is False and access.cap_prm is not None and target.cap_prm is not None and target.cap_prm & ~access.cap_prm:
        return causes.CAPABILITIES, ", ".join(cap_names(target.cap_prm & ~access.cap_prm))
    return None


# capability numbers (linux/capability.h), for the line that names what the sidecar lacks
CAP_NAMES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN "
    "SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE "
    "MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()


def cap_names(mask: int, most: int = 4) -> list[str]:
    """``CAP_CHOWN, CAP_KILL, ...`` of a mask, the first ``most`` and how many more."""
    names = [f"CAP_{CAP_NAMES[i]}" if i < len(CAP_NAMES) else f"capability {i}" for i in range(64) if mask >> i & 1]
    return names[:most] + ([f"{len(names) - most} more"] if len(names) > most else [])
