"""Internal: which Kubernetes pod a process runs in, read from its ``/proc/<pid>/cgroup`` (pure: the text
is handed in; standard library only, since the recorder inside vLLM uses it too).

The kubelet puts every container under its pod's cgroup, and names the pod's cgroup after the
pod's UID. What the path looks like depends on the cgroup driver and the runtime:

- **cgroupfs** driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<container id>`` (containerd
  names the container's cgroup by its id, CRI-O ``crio-<id>``);
- **systemd** driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` (CRI-O ``crio-<id>.scope``, Docker ``docker-<id>.scope``), the
  UID's dashes written as underscores (a dash is systemd's nesting character);
- a nested kubelet (kind, a kubelet under ``kubelet.slice``) prefixes ``kubelet-`` to each slice.

Cgroup v1 lists one line per hierarchy (``4:memory:/kubepods/...``), v2 one unified line
(``0::/kubepods.slice/...``); a hybrid host has both. A reader in a cgroup namespace of its own
sees paths relative to its root (``0::/../../kubepods-besteffort-pod<uid>.slice/...``); the pod's
segment is still there unless the process is inside the reader's own container, where the path
is ``/`` and the pod cannot be told from it (the recorder then needs the downward API's UID).

A static pod's UID is the hash of its manifest (32 hex digits, no dashes); both forms are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# the pod segment: ``pod<uid>`` after a slash or a dash, ending the segment (or ``.slice``)
_POD = re.compile(r"(?:^|[/-])pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?(?=/|$)")
# the container's own segment, after the pod's: the runtime's prefix, its id, systemd's suffix
_CONTAINER = re.compile(r"^(?P<prefix>cri-containerd-|crio-conmon-|crio-|docker-|containerd-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")
_RUNTIMES = {"cri-containerd-": "containerd", "containerd-": "containerd", "crio-": "cri-o", "crio-conmon-": "cri-o", "docker-": "docker"}


@dataclass(frozen=True, slots=True)
class PodCgroup:
    pod_uid: str  # as the API server writes it (dashes)
    container_id: str | None  # the runtime's container id (64 hex), None for the pod's own cgroup
    runtime: str | None  # "containerd", "cri-o", "docker"; None when the name does not say
    conmon: bool = False  # CRI-O's monitor process of the container, not the container itself


def pod_of_path(path: str) -> PodCgroup | None:
    """The pod (and container) of one cgroup path, or None when the path is in no pod."""
    if "kubepods" not in path:
        return None
    matches = list(_POD.finditer(path))
    if not matches:
        return None
    found = matches[-1]  # the innermost pod segment
    uid = found.group("uid").replace("_", "-")
    rest = path[found.end() :].strip("/").split("/")
    container_id = runtime = None
    conmon = False
    if rest and rest[0]:
        m = _CONTAINER.match(rest[0])
        if m is not None:
            container_id = m.group("id")
            prefix = m.group("prefix")
            runtime = _RUNTIMES.get(prefix) if prefix else None
            conmon = prefix == "crio-conmon-"
    return PodCgroup(uid, container_id, runtime, conmon)


def pod_of_cgroup(text: str) -> PodCgroup | None:
    """The pod a process runs in, from its ``/proc/<pid>/cgroup``; None for a process in no pod
    (a bare process, a system service, the node's own daemons) or a path that does not say.

    The unified (v2) line is read first, then each v1 hierarchy; a line naming a container wins
    over one naming only the pod (some v1 controllers stop at the pod's cgroup)."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    ordered = sorted(lines, key=lambda parts: parts[0] != "0")
    best: PodCgroup | None = None
    for parts in ordered:
        got = pod_of_path(parts[2].strip())
        if got is None:
            continue
        if got.container_id is not None:
            return got
        best = best or got
    return best
