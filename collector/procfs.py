"""Internal: pure reads of ``/proc`` that more than one stage needs (the root is a parameter: tests use
a fake tree)."""

from __future__ import annotations

from pathlib import Path

from collector.cgroup import PodCgroup, pod_of_cgroup


def parent_pid(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The parent of ``pid``, or None when it is gone or unreadable."""
    try:
        text = (proc / str(pid) / "status").read_text()
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        if line.startswith("PPid:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def pod_of_pid(pid: int, proc: Path = Path("/proc")) -> PodCgroup | None:
    """The Kubernetes pod (and container) ``pid`` runs in, from its cgroup; None when it is in no
    pod, gone or unreadable."""
    try:
        text = (proc / str(pid) / "cgroup").read_text(errors="replace")
    except (OSError, ValueError):
        return None
    return pod_of_cgroup(text)
