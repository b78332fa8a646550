"""The security claims of the Kubernetes forms, checked on the built manifests (beside checkov's
generic checks, which .ci/run runs through scripts/policy-check.sh): no container privileged or
escalating, every capability dropped and only SYSLOG and SYS_PTRACE added back, and only in the
node sidecar;
host namespaces and host paths only where docs/deploy.md says why; and the Pod Security level
each pod needs (the baseline rules evaluated here) is the one its namespace is labelled with."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.test_kubernetes import FORMS, build

# Pod Security Standards, "baseline": the capabilities a container may add
BASELINE_CAPS = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
# what each workload is allowed to need beyond baseline, and why (docs/deploy.md)
EXPECTED = {
    "DaemonSet/flightrec-node": {
        "hostPID",  # NVML's per-process memory, Xid pids
        "hostPath /var/log/pods",  # the engines' logs
        "hostPath /run/flightrec",  # the engines' recorder rings
        "hostPath /var/lib/flightrec",  # the spool that survives a restart
        "hostPath /dev/null",  # the NVIDIA toolkit's "all GPUs" volume mount
        "hostPath /var/lib/kubelet/pod-resources",  # the kubelet's PodResources socket: which pod holds each GPU
        "capability SYSLOG",  # the kernel log through syslog(2)
        "capability SYS_PTRACE",  # a wedged engine's stacks (py-spy reads its memory)
    },
    "Deployment/vllm-decode@inference": {"hostPath /run/flightrec"},
    "Deployment/vllm-decode@default": set(),
}
HOST_PATHS_READ_ONLY = {"/var/log/pods", "/dev/null", "/var/lib/kubelet/pod-resources"}


def workloads() -> list[tuple[str, dict[str, Any], dict[str, dict[str, Any]]]]:
    out = []
    for form in FORMS:
        docs = build(form)
        namespaces = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Namespace"}
        for d in docs:
            if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
                out.append((form, d, namespaces))
    return out


def name_of(d: dict[str, Any]) -> str:
    ns = d["metadata"].get("namespace") or "default"
    base = f"{d['kind']}/{d['metadata']['name']}"
    return base if d["kind"] == "DaemonSet" else f"{base}@{ns}"


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod.get("initContainers", []) + pod["containers"]


def baseline_violations(pod: dict[str, Any]) -> set[str]:
    """What of a pod the Pod Security "baseline" level refuses (the rules that apply here)."""
    out = set()
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        if pod.get(key):
            out.add(key)
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            out.add(f"hostPath {v['hostPath']['path']}")
    seccomp = (pod.get("securityContext") or {}).get("seccompProfile", {}).get("type")
    for c in containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.add("privileged")
        for cap in (sc.get("capabilities") or {}).get("add", []):
            if cap not in BASELINE_CAPS:
                out.add(f"capability {cap}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                out.add("hostPort")
        if (sc.get("seccompProfile") or {}).get("type", seccomp) == "Unconfined":
            out.add("seccomp Unconfined")
    return out


WORKLOADS = workloads()


@pytest.mark.parametrize("form, workload, namespaces", WORKLOADS, ids=[f"{f}:{name_of(w)}" for f, w, _ in WORKLOADS])
def test_each_pod_needs_only_what_is_said_and_its_namespace_allows_it(form: str, workload: dict[str, Any], namespaces: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    needs = baseline_violations(pod)
    assert needs == EXPECTED[name_of(workload)], name_of(workload)
    if needs:
        ns = namespaces[workload["metadata"]["namespace"]]
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.parametrize("form, workload, namespaces", WORKLOADS, ids=[f"{f}:{name_of(w)}" for f, w, _ in WORKLOADS])
def test_no_container_is_privileged_or_escalates_and_all_drop_every_capability(form: str, workload: dict[str, Any], namespaces: Any) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert (pod.get("securityContext") or {}).get("seccompProfile") == {"type": "RuntimeDefault"}
    for c in containers(pod):
        sc = c.get("securityContext") or {}
        # privileged: true beside allowPrivilegeEscalation: false is refused by the API server;
        # neither form needs privileged at all
        assert sc.get("privileged") in (None, False), c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        caps = sc.get("capabilities") or {}
        assert caps.get("drop") == ["ALL"], c["name"]
        added = set(caps.get("add", []))
        if c["name"] == "flightrec":
            assert sc.get("readOnlyRootFilesystem") is True
            assert added <= {"SYSLOG", "SYS_PTRACE"}
        else:
            assert not added, c["name"]
    for v in pod.get("volumes", []):
        path = v.get("hostPath", {}).get("path")
        if path in HOST_PATHS_READ_ONLY:
            mounts = [m for c in containers(pod) for m in c.get("volumeMounts", []) if m["name"] == v["name"]]
            assert mounts and all(m.get("readOnly") for m in mounts), path
        assert path not in ("/", "/proc", "/sys", "/dev/kmsg", "/var/run/docker.sock", "/run/containerd/containerd.sock"), path


def test_only_the_node_sidecar_reads_the_api_server() -> None:
    for _, workload, _ in WORKLOADS:
        pod = workload["spec"]["template"]["spec"]
        reads_api = workload["kind"] == "DaemonSet"
        assert pod.get("automountServiceAccountToken") is reads_api, name_of(workload)
