"""Which pod a process runs in, from /proc/<pid>/cgroup as the kubelet and the runtimes write it:
both cgroup drivers, both cgroup versions, containerd, CRI-O and Docker, a nested kubelet, a
reader in a cgroup namespace of its own, and processes in no pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.cgroup import PodCgroup, pod_of_cgroup, pod_of_path
from collector.procfs import pod_of_pid

UID = "7f3c2b1a-9d4e-4c5f-8a6b-0e1d2c3b4a59"
SYSD = UID.replace("-", "_")
CID = "4b1f0c6d2e8a9b3c5d7e1f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c"

# cgroup v1, cgroupfs driver, containerd (a burstable pod): one line per hierarchy
V1_CGROUPFS_CONTAINERD = f"""12:hugetlb:/kubepods/burstable/pod{UID}/{CID}
11:memory:/kubepods/burstable/pod{UID}/{CID}
10:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
9:devices:/kubepods/burstable/pod{UID}/{CID}
4:pids:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""
# cgroup v1, systemd driver, CRI-O (a guaranteed pod: no QoS slice)
V1_SYSTEMD_CRIO = f"""11:memory:/kubepods.slice/kubepods-pod{SYSD}.slice/crio-{CID}.scope
10:cpu,cpuacct:/kubepods.slice/kubepods-pod{SYSD}.slice/crio-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-pod{SYSD}.slice/crio-{CID}.scope
"""
# cgroup v2, systemd driver, containerd (the common GPU Operator node today)
V2_SYSTEMD_CONTAINERD = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSD}.slice/cri-containerd-{CID}.scope\n"
# cgroup v2, cgroupfs driver, CRI-O (a best-effort pod)
V2_CGROUPFS_CRIO = f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n"
# cgroup v2, systemd driver, Docker through cri-dockerd
V2_SYSTEMD_DOCKER = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSD}.slice/docker-{CID}.scope\n"
# a kubelet nested under kubelet.slice (kind), cgroup v2
V2_NESTED = (
    f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
    f"kubelet-kubepods-besteffort-pod{SYSD}.slice/cri-containerd-{CID}.scope\n"
)
# the engine seen from the sidecar's container (both in cgroup namespaces of their own, v2)
V2_FROM_ANOTHER_NAMESPACE = f"0::/../../kubepods-burstable-pod{SYSD}.slice/cri-containerd-{CID}.scope\n"
# a static pod (its UID is its manifest's hash), cgroupfs, containerd
STATIC_UID = "0f6b2c4d8e1a3b5c7d9e0f1a2b3c4d5e"
V1_STATIC = f"4:memory:/kubepods/besteffort/pod{STATIC_UID}/{CID}\n"

NOT_IN_A_POD = {
    "a bare process (v2)": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "a system service (v1)": "11:memory:/system.slice/containerd.service\n1:name=systemd:/system.slice/containerd.service\n",
    "docker without kubernetes (v2)": f"0::/system.slice/docker-{CID}.scope\n",
    "inside its own cgroup namespace": "0::/\n",
    "the kubelet's own slice": "0::/kubepods.slice\n",
    "empty": "",
}


@pytest.mark.parametrize(
    ("text", "runtime"),
    [
        (V1_CGROUPFS_CONTAINERD, None),  # cgroupfs' containerd cgroup is the bare id
        (V1_SYSTEMD_CRIO, "cri-o"),
        (V2_SYSTEMD_CONTAINERD, "containerd"),
        (V2_CGROUPFS_CRIO, "cri-o"),
        (V2_SYSTEMD_DOCKER, "docker"),
        (V2_NESTED, "containerd"),
        (V2_FROM_ANOTHER_NAMESPACE, "containerd"),
    ],
    ids=["v1-cgroupfs-containerd", "v1-systemd-crio", "v2-systemd-containerd", "v2-cgroupfs-crio", "v2-systemd-docker", "v2-nested", "v2-cgroupns"],
)
def test_the_pod_and_container_of_every_driver_version_and_runtime(text: str, runtime: str | None) -> None:
    assert pod_of_cgroup(text) == PodCgroup(UID, CID, runtime)


def test_a_static_pod_uid_is_its_hash() -> None:
    assert pod_of_cgroup(V1_STATIC) == PodCgroup(STATIC_UID, CID, None)


@pytest.mark.parametrize("text", list(NOT_IN_A_POD.values()), ids=list(NOT_IN_A_POD))
def test_a_process_in_no_pod(text: str) -> None:
    assert pod_of_cgroup(text) is None


def test_the_pod_cgroup_itself_and_crio_monitor() -> None:
    # a v1 controller that stops at the pod; the other line names the container: that one wins
    mixed = f"5:cpuset:/kubepods/burstable/pod{UID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    assert pod_of_cgroup(mixed) == PodCgroup(UID, CID, None)
    assert pod_of_path(f"/kubepods/burstable/pod{UID}") == PodCgroup(UID, None, None)
    conmon = pod_of_path(f"/kubepods.slice/kubepods-pod{SYSD}.slice/crio-conmon-{CID}.scope")
    assert conmon == PodCgroup(UID, CID, "cri-o", conmon=True)


def test_malformed_lines_are_no_pod() -> None:
    assert pod_of_cgroup("garbage\n\x00\x01\n") is None
    assert pod_of_cgroup(f"0::/kubepods/burstable/podnot-a-uid/{CID}\n") is None


def test_pod_of_pid_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "415").mkdir()
    (tmp_path / "415" / "cgroup").write_text(V2_SYSTEMD_CONTAINERD)
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(NOT_IN_A_POD["a bare process (v2)"])
    assert pod_of_pid(415, tmp_path) == PodCgroup(UID, CID, "containerd")
    assert pod_of_pid(7, tmp_path) is None
    assert pod_of_pid(9999, tmp_path) is None  # gone


def test_own_cgroup_is_read_by_the_process(tmp_path: Path) -> None:
    # the real kernel's file for this process parses (in a pod or not: never raises)
    text = Path("/proc/self/cgroup").read_text()
    got = pod_of_cgroup(text)
    assert got is None or len(got.pod_uid) in (32, 36)
