"""The Kubernetes manifests: built with `kubectl kustomize` (kustomize v5 inside kubectl),
validated offline against the Kubernetes OpenAPI schemas (kubernetes-validate, strict), and
checked for what wiring vLLM to the sidecar needs: one recorder folder, one engine name, the
scheduler class, the secrets, the probes on the configured port, the node form's privileges."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from collector.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")
KUBE_VERSION = "1.30.0"  # the oldest release the manifests claim (internalTrafficPolicy, sizeLimit: long GA)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with its built-in kustomize) not installed")


def build(path: str) -> list[dict[str, Any]]:
    r = subprocess.run([str(KUBECTL), "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in docs if d["kind"] == kind])
    return found[0]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    [c] = [c for c in pod["containers"] if c["name"] == name]
    return c


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def config_of(docs: list[dict[str, Any]], prefix: str, tmp_path: Path) -> Any:
    [cm] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)]
    path = tmp_path / "flightrec.yaml"
    path.write_text(cm["data"]["flightrec.yaml"])
    # the token comes from the Secret in the pod, the node's name from the downward API
    with mock.patch.dict(os.environ, {"FLIGHTREC_DISCOVERY__NODE_NAME": "gpu-node-a"}):
        return load_settings(path, api_token="x")


FORMS = ["base", "daemonset", "engines", "overlays/dcgm-exporter"]


@pytest.mark.parametrize("form", [*FORMS, "components/servicemonitor"])
def test_kustomize_builds(form: str) -> None:
    assert build(form)


@pytest.mark.parametrize("form", FORMS)
def test_manifests_validate_against_the_kubernetes_schemas(form: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in build(form):
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's kinds: no schema in kubernetes-validate
        kv.validate(doc, KUBE_VERSION, strict=True)  # raises ValidationError with the path


def test_servicemonitor_has_the_operator_shape() -> None:
    sm = one(build("components/servicemonitor"), "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["kind"] == "ServiceMonitor"
    [ep] = sm["spec"]["endpoints"]
    assert ep["port"] == "flightrec" and ep["authorization"]["credentials"] == {"name": "flightrec-secrets", "key": "api-token"}
    assert sm["spec"]["namespaceSelector"] == {"any": True}


def test_the_vllm_scrape_gets_the_labels_the_rules_join_on(tmp_path: Path) -> None:
    """A rule alert and the sidecar's alert of one fault must carry the same engine and Hostname:
    the PodMonitor names each vLLM pod's target as the sidecar names the engine (the annotation
    flightrec.io/engine-name, else the pod's name, as discovery does) and its node."""
    pm = one(build("components/servicemonitor"), "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    [expr] = pm["spec"]["selector"]["matchExpressions"]
    assert expr == {"key": "flightrec.io/engine", "operator": "Exists"}
    [ep] = pm["spec"]["podMetricsEndpoints"]
    relabel = [(r["sourceLabels"], r["targetLabel"], r.get("regex")) for r in ep["relabelings"]]
    assert relabel == [
        (["__meta_kubernetes_pod_name"], "flightrec_engine", None),
        (["__meta_kubernetes_pod_annotation_flightrec_io_engine_name"], "flightrec_engine", "(.+)"),
        (["__meta_kubernetes_pod_node_name"], "Hostname", None),
    ]
    from collector.parsers.kube_pods import ENGINE_NAME_ANNOTATION

    assert ENGINE_NAME_ANNOTATION == "flightrec.io/engine-name"
    # the pod form: the configured name is on the pod, with the label the selector wants
    docs = build("base")
    pod = one(docs, "Deployment")["spec"]["template"]
    [engine] = config_of(docs, "flightrec-config", tmp_path).engines
    assert pod["metadata"]["annotations"][ENGINE_NAME_ANNOTATION] == engine.name
    assert "flightrec.io/engine" in pod["metadata"]["labels"]
    assert any(p["name"] == ep["port"] for p in container(pod["spec"], "vllm")["ports"])
    # the engines the DaemonSet finds: the label, the port name
    eng = one(build("engines"), "Deployment")["spec"]["template"]
    assert "flightrec.io/engine" in eng["metadata"]["labels"]
    assert any(p["name"] == ep["port"] for p in container(eng["spec"], "vllm")["ports"])
    # the sidecars name their host by the node, as the relabelling does
    for form in ("base", "daemonset"):
        spec = next(d for d in build(form) if d["kind"] in ("Deployment", "DaemonSet"))["spec"]["template"]["spec"]
        assert env(container(spec, "flightrec"))["FLIGHTREC_HOST_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_pod_form_shares_the_recorder_folder_and_names_the_engine(tmp_path: Path) -> None:
    docs = build("base")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    vllm, side = container(pod, "vllm"), container(pod, "flightrec")
    settings = config_of(docs, "flightrec-config", tmp_path)
    [engine] = settings.engines
    # one folder: the same in-memory emptyDir, the same path on both sides
    [shm] = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    for c in (vllm, side):
        assert {"name": shm["name"], "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert env(vllm)["FLIGHTREC_RECORDER_DIR"] == str(settings.recorder_dir)
    assert str(settings.recorder_dir).startswith("/dev/shm/")
    # one name, the per-request scheduler, the log the sidecar follows
    assert env(vllm)["FLIGHTREC_ENGINE_NAME"] == engine.name
    # vllm serve itself is the container's first process: no shell, no tee
    assert vllm["command"] == ["vllm", "serve"] and "--scheduler-cls=collector.vllm.RecordingScheduler" in vllm["args"]
    assert engine.log is None and not any("/var/log" in m["mountPath"] for m in vllm["volumeMounts"])
    # no GPU, no kernel log in the sidecar's container: it says so rather than pretend
    assert settings.nvml == "off" and settings.kmsg == "off"
    assert engine.url == f"http://127.0.0.1:{vllm['ports'][0]['containerPort']}"
    # secrets and the node name from the cluster; probes on the port the config serves
    side_env = env(side)
    assert side_env["FLIGHTREC_DATABASE"]["secretKeyRef"]["name"] == "flightrec-secrets"
    assert side_env["FLIGHTREC_API_TOKEN"]["secretKeyRef"]["key"] == "api-token"
    assert side_env["FLIGHTREC_HOST_NAME"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    [port] = side["ports"]
    assert port["containerPort"] == settings.port
    assert side["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    secret = one(docs, "Secret", "flightrec-secrets")
    assert set(secret["stringData"]) == {"database-url", "api-token"}
    # the vLLM Service is discoverable by annotations
    svc = one(docs, "Service", "vllm-decode")
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(vllm["ports"][0]["containerPort"])


def uid_of(pod: dict[str, Any], c: dict[str, Any]) -> int | None:
    """The uid a container runs as: its own securityContext's, else the pod's, else the image's (None)."""
    own = (c.get("securityContext") or {}).get("runAsUser")
    return own if own is not None else (pod.get("securityContext") or {}).get("runAsUser")


def test_the_engine_and_the_sidecar_run_as_one_non_root_user() -> None:
    """Ring files are 0600 in a 0700 folder: a sidecar of another uid than the engine's cannot
    read them (vLLM's image runs as root unless told otherwise)."""
    pod = one(build("base"), "Deployment")["spec"]["template"]["spec"]
    vllm, side = container(pod, "vllm"), container(pod, "flightrec")
    assert uid_of(pod, vllm) == uid_of(pod, side) and uid_of(pod, side) not in (None, 0)
    # a non-root vLLM needs somewhere writable for its caches and the model
    home = env(vllm)["HOME"]
    assert any(home.startswith(m["mountPath"]) for m in vllm["volumeMounts"]) and env(vllm)["HF_HOME"].startswith(home)


def test_the_node_form_finds_engines_and_sees_gpus_logs_and_the_kernel(tmp_path: Path) -> None:
    docs = build("daemonset")
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    side = container(pod, "flightrec")
    settings = config_of(docs, "flightrec-node-config", tmp_path)
    # discovery: this node's name from the downward API, read access to pods and nothing else
    assert settings.discovery.mode == "kubernetes" and not settings.engines
    assert env(side)["FLIGHTREC_DISCOVERY__NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == sa
    role = one(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ds["metadata"]["namespace"]}]
    # the engines' logs where the kubelet keeps them, read-only
    [logs] = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/var/log/pods"]
    assert {"name": logs["name"], "mountPath": str(settings.discovery.log_root), "readOnly": True} in side["volumeMounts"]
    # the kubelet's PodResources socket (which pod holds each GPU), read-only, where the settings look
    [pr] = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/pod-resources"]
    assert {"name": pr["name"], "mountPath": str(settings.discovery.pod_resources_socket.parent), "readOnly": True} in side["volumeMounts"]
    assert settings.discovery.pod_resources and settings.discovery.pod_resources_socket.name == "kubelet.sock"
    # the kernel log through syslog(2): no /dev/kmsg device, CAP_SYSLOG; a wedged engine's stacks:
    # the node's pids and CAP_SYS_PTRACE; no other capability
    assert settings.kmsg == "syslog"
    assert not any(v.get("hostPath", {}).get("path") == "/dev/kmsg" for v in pod["volumes"])
    sc = side["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG", "SYS_PTRACE"]}
    assert pod["hostPID"] is True and settings.stacks.enabled
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    # every GPU for NVML, none reserved: the env var and the hardened toolkit's volume mount
    assert env(side)["NVIDIA_VISIBLE_DEVICES"] == "all" and env(side)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    [allgpus] = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/dev/null"]
    assert {"name": allgpus["name"], "mountPath": "/var/run/nvidia-container-devices/all", "readOnly": True} in side["volumeMounts"]
    assert "nvidia.com/gpu" not in str(side["resources"])
    # the recorder folder the engines mount too
    [rec] = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == str(settings.recorder_dir)]
    assert {"name": rec["name"], "mountPath": str(settings.recorder_dir)} in side["volumeMounts"]
    assert settings.port == side["ports"][0]["containerPort"]
    # the namespace says the Pod Security level it needs
    ns = one(docs, "Namespace")
    assert ns["metadata"]["name"] == ds["metadata"]["namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_engines_the_daemonset_finds(tmp_path: Path) -> None:
    """The example engine is what discovery reads: its label, container, port, recorder folder and
    name all agree with the node sidecar's settings and the pod parser."""
    from collector.parsers.kube_pods import engine_of_pod

    node = config_of(build("daemonset"), "flightrec-node-config", tmp_path)
    docs = build("engines")
    dep = one(docs, "Deployment")
    tmpl = dep["spec"]["template"]
    key = node.discovery.label_selector
    assert key in tmpl["metadata"]["labels"]
    vllm = container(tmpl["spec"], node.discovery.container)
    assert vllm["command"] == ["vllm", "serve"]  # PID 1, no shell, output to stdout
    assert env(vllm)["FLIGHTREC_ENGINE_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env(vllm)["FLIGHTREC_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}  # rings join their pod by UID
    assert env(vllm)["FLIGHTREC_RECORDER_DIR"] == str(node.recorder_dir)
    [rec] = [v for v in tmpl["spec"]["volumes"] if v.get("hostPath", {}).get("path") == str(node.recorder_dir)]
    assert {"name": rec["name"], "mountPath": str(node.recorder_dir)} in vllm["volumeMounts"]
    # as the API server would serve it on a node: the parser finds the engine, its port and GPU
    pod = {
        "metadata": {**tmpl["metadata"], "name": "vllm-decode-7c9f8d-xk2lp", "namespace": dep["metadata"]["namespace"], "uid": "u-1"},
        "spec": {**tmpl["spec"], "nodeName": "gpu-node-a"},
        "status": {"phase": "Running", "podIP": "10.244.3.18"},
    }
    engine = engine_of_pod(pod, default_container=node.discovery.container, default_port=node.discovery.port)
    assert engine.name == "vllm-decode-7c9f8d-xk2lp" and engine.url == "http://10.244.3.18:8000"
    assert engine.gpus == 1 and engine.pair == "pd-0" and engine.container == "vllm"
    assert engine.log_dir == f"{dep['metadata']['namespace']}_vllm-decode-7c9f8d-xk2lp_u-1/vllm"
    ns = one(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"  # the hostPath recorder folder


def test_the_dcgm_overlay_reads_the_nodes_own_exporter() -> None:
    docs = build("overlays/dcgm-exporter")
    side = container(one(docs, "DaemonSet")["spec"]["template"]["spec"], "flightrec")
    svc = one(docs, "Service", "flightrec-dcgm-exporter-local")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    url = env(side)["FLIGHTREC_DCGM_URL"]
    assert env(side)["FLIGHTREC_GPU_METRICS"] == "dcgm"
    assert url == f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}/metrics"
    from collector.settings import load_settings

    assert load_settings(gpu_metrics="dcgm", dcgm_url=url).dcgm_url == url
