"""A fake /proc tree for the join and pid-routing tests."""

from __future__ import annotations

import os
from pathlib import Path

_HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def tcp_row(sl: int, port: int, inode: int, state: str = "0A", addr: str = "00000000") -> str:
    return (
        f"{sl:4d}: {addr}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000"
        f"  1000        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
    )


def fake_proc(
    root: Path,
    *,
    listeners: dict[int, tuple[int, int]] | None = None,
    parents: dict[int, int] | None = None,
    other_rows: str = "",
    tcp6: bool = False,
) -> Path:
    """``listeners``: {pid: (port, inode)} listening; ``parents``: {pid: ppid}."""
    listeners, parents = listeners or {}, parents or {}
    (root / "net").mkdir(parents=True, exist_ok=True)
    rows = "".join(tcp_row(i, port, inode) for i, (port, inode) in enumerate(listeners.values()))
    (root / "net" / ("tcp6" if tcp6 else "tcp")).write_text(_HEAD + rows + other_rows)
    for pid, (_, inode) in listeners.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True, exist_ok=True)
        os.symlink("/dev/null", fd / "0")
        os.symlink(f"socket:[{inode + 1000}]", fd / "3")  # some other socket
        os.symlink(f"socket:[{inode}]", fd / "7")
    for pid, ppid in parents.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nPPid:\t{ppid}\n")
    return root
