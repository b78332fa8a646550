"""The Kubernetes manifests: built with `kubectl kustomize` (kustomize v5 inside kubectl),
validated offline against the Kubernetes OpenAPI schemas (kubernetes-validate, strict), and
checked for what wiring vLLM to the sidecar needs: one recorder folder, one engine name, the
scheduler class, the secrets, the probes on the configured port, the node form's privileges."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

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
    return load_settings(path, api_token="x")  # the token comes from the Secret in the pod


@pytest.mark.parametrize("form", ["base", "daemonset", "components/servicemonitor"])
def test_kustomize_builds(form: str) -> None:
    assert build(form)


@pytest.mark.parametrize("form", ["base", "daemonset"])
def test_manifests_validate_against_the_kubernetes_schemas(form: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in build(form):
        kv.validate(doc, KUBE_VERSION, strict=True)  # raises ValidationError with the path


def test_servicemonitor_has_the_operator_shape() -> None:
    sm, _ = build("components/servicemonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["kind"] == "ServiceMonitor"
    [ep] = sm["spec"]["endpoints"]
    assert ep["port"] == "flightrec" and ep["authorization"]["credentials"] == {"name": "flightrec-secrets", "key": "api-token"}


@pytest.mark.parametrize("form", ["base", "daemonset"])
def test_the_vllm_scrape_gets_the_labels_the_rules_join_on(form: str, tmp_path: Path) -> None:
    # a rule alert and the sidecar's alert of one fault must carry the same engine and Hostname
    _, vllm_sm = build("components/servicemonitor")
    assert vllm_sm["kind"] == "ServiceMonitor"
    [ep] = vllm_sm["spec"]["endpoints"]
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in ep["relabelings"]}
    assert relabel == {"flightrec_engine": ["__meta_kubernetes_service_label_flightrec_io_engine"], "Hostname": ["__meta_kubernetes_pod_node_name"]}
    docs = build(form)
    settings = config_of(docs, "flightrec-config" if form == "base" else "flightrec-node", tmp_path)
    [engine] = settings.engines
    port = int(engine.url.rsplit(":", 1)[1])
    [svc] = [
        d for d in docs if d["kind"] == "Service" and any(p["port"] == port for p in d["spec"]["ports"]) and "flightrec" not in d["metadata"]["name"]
    ]
    [expr] = vllm_sm["spec"]["selector"]["matchExpressions"]
    assert expr == {"key": "flightrec.io/engine", "operator": "Exists"}
    assert svc["metadata"]["labels"]["flightrec.io/engine"] == engine.name
    assert any(p["name"] == ep["port"] for p in svc["spec"]["ports"])
    # the sidecar names its host by the node, as the relabelling does
    pod = next(d for d in docs if d["kind"] in ("Deployment", "DaemonSet"))["spec"]["template"]["spec"]
    side = container(pod, "flightrec")
    assert env(side)["FLIGHTREC_HOST_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


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
    command = " ".join(vllm["command"] + vllm["args"])
    assert "--scheduler-cls collector.vllm.RecordingScheduler" in command and "pipefail" in command
    assert engine.log and f"tee -a {engine.log}" in command
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


def test_the_node_form_has_host_pid_kmsg_read_only_and_only_syslog(tmp_path: Path) -> None:
    docs = build("daemonset")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    side = container(pod, "flightrec")
    [kmsg_vol] = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/dev/kmsg"]
    assert kmsg_vol["hostPath"]["type"] == "CharDevice"
    assert {"name": kmsg_vol["name"], "mountPath": "/dev/kmsg", "readOnly": True} in side["volumeMounts"]
    sc = side["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert sc.get("privileged") is not True and sc["allowPrivilegeEscalation"] is False
    settings = config_of(docs, "flightrec-node-config", tmp_path)
    assert settings.kmsg == "auto" and settings.port == side["ports"][0]["containerPort"]
    [rec] = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == str(settings.recorder_dir)]
    assert {"name": rec["name"], "mountPath": str(settings.recorder_dir)} in side["volumeMounts"]
    local = one(docs, "Service", "vllm-decode-local")
    assert local["spec"]["internalTrafficPolicy"] == "Local"
