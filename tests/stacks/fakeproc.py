"""A fake ``/proc`` tree: the files the stacks read, written as the kernel writes them."""

from __future__ import annotations

from pathlib import Path


def add(
    root: Path,
    pid: int,
    *,
    ppid: int,
    cmdline: list[str],
    name: str = "python3",
    uid: int = 0,
    gid: int = 0,
    nspid: tuple[int, ...] | None = None,
    environ: dict[str, str] | None = None,
    maps: str = "",
    cap_eff: int | None = None,
) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True)
    ns = "\t".join(str(n) for n in (nspid or (pid,)))
    status = (
        f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t{ppid}\nTracerPid:\t0\n"
        f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\nNSpid:\t{ns}\n"
    )
    if cap_eff is not None:
        status += f"CapInh:\t0000000000000000\nCapPrm:\t{cap_eff:016x}\nCapEff:\t{cap_eff:016x}\n"
    (d / "status").write_text(status)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (environ or {}).items()) + b"\0")
    (d / "maps").write_text(maps)
    return d


def reader(root: Path, *, uid: int = 0, cap_sys_ptrace: bool = True, yama: int | None = None, caps: int | None = None) -> None:
    """``/proc/self`` (the sidecar) and Yama's setting. ``caps``: its capabilities (default: all,
    less CAP_SYS_PTRACE when ``cap_sys_ptrace`` is off)."""
    if caps is None:
        caps = 0x000001FFFEFFFFFF if cap_sys_ptrace else 0x000001FFFEFFFFFF & ~(1 << 19)
    add(root / "_self", 1, ppid=0, cmdline=["flightrec", "serve"], name="flightrec", uid=uid, gid=uid, cap_eff=caps)
    (root / "_self" / "1").rename(root / "self")
    (root / "_self").rmdir()
    if yama is not None:
        (root / "sys" / "kernel" / "yama").mkdir(parents=True)
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{yama}\n")


def ring_map(path: Path) -> str:
    """A maps line for a ring file mapped shared, as the kernel prints it."""
    import os

    st = path.stat()
    return f"7f2c5a000000-7f2c5a400000 rw-s 00000000 {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}   {path}\n"
