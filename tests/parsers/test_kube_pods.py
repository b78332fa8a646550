"""Engines read from Pod objects in the v1 API's shape (tests/fixtures/kubernetes: a node's pod
list written to the v1 schema, and checked against it here)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from collector.parsers.kube_pods import PodFormatError, engine_of_pod, kv_role, unique_names

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes" / "podlist-gpu-node-a.json"


def pods() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text())["items"]


def test_the_fixture_is_what_the_v1_api_serves() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for pod in pods():
        kv.validate(pod, "1.30.0", strict=True)


def test_each_pod_gives_its_engine() -> None:
    prefill, decode, small, pending = (engine_of_pod(p) for p in pods())
    assert prefill.name == "vllm-prefill-0" and prefill.namespace == "inference"
    assert prefill.url == "http://10.244.3.17:8000" and prefill.container == "vllm"
    assert prefill.role == "prefill" and prefill.pair == "pd-0" and prefill.gpus == 4
    assert prefill.log_dir == "inference_vllm-prefill-0_3f9a1c2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b/vllm"
    assert prefill.node == "gpu-node-a" and prefill.phase == "Running" and not prefill.terminating
    assert decode.role == "decode" and decode.restarts == 1
    # the container and port named by annotations; the role too
    assert small.container == "server" and small.url == "http://10.244.3.21:9000" and small.role == "standalone" and small.gpus == 1
    assert small.log_dir.endswith("/server") and small.pair is None
    # no IP yet: no URL
    assert pending.url is None and pending.phase == "Pending"


def test_port_without_annotation_named_http_first_or_default() -> None:
    pod = copy.deepcopy(pods()[0])
    c = pod["spec"]["containers"][0]
    c["ports"] = [{"containerPort": 9100, "name": "metrics"}, {"containerPort": 8080, "name": "http"}]
    assert engine_of_pod(pod).url == "http://10.244.3.17:8080"
    c["ports"] = [{"containerPort": 9100, "name": "metrics"}]
    assert engine_of_pod(pod).url == "http://10.244.3.17:9100"
    del c["ports"]
    assert engine_of_pod(pod, default_port=8123).url == "http://10.244.3.17:8123"
    pod["status"]["podIP"] = "fd00::17"
    assert engine_of_pod(pod).url == "http://[fd00::17]:8000"


def test_name_annotation_terminating_and_no_gpu() -> None:
    pod = copy.deepcopy(pods()[0])
    pod["metadata"]["annotations"]["flightrec.io/engine-name"] = "prefill-a"
    pod["metadata"]["deletionTimestamp"] = "2026-12-03T09:00:00Z"
    pod["spec"]["containers"][0]["resources"] = {}
    e = engine_of_pod(pod)
    assert e.name == "prefill-a" and e.terminating and e.gpus is None


def test_kv_role_in_its_spellings() -> None:
    assert kv_role(["--kv-transfer-config", '{"kv_role":"kv_consumer"}']) == "decode"
    assert kv_role(['--kv-transfer-config={"kv_role": "kv_both"}']) == "both"
    assert kv_role(["--kv-transfer-config", "not json"]) is None
    assert kv_role(["--model", "m"]) is None
    # a shell script's words (sh -c "exec vllm serve ...")
    pod = copy.deepcopy(pods()[0])
    pod["spec"]["containers"][0]["command"] = ["sh", "-c"]
    pod["spec"]["containers"][0]["args"] = ["""exec vllm serve m --kv-transfer-config '{"kv_role":"kv_producer"}'"""]
    pod["metadata"]["annotations"] = {}
    assert engine_of_pod(pod).role == "prefill"


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda p: p.pop("metadata"), "metadata.name"),
        (lambda p: p["metadata"].pop("uid"), "metadata.uid"),
        (lambda p: p["spec"].update(containers=[]), "spec.containers"),
        (lambda p: p["spec"].update(containers="x"), "spec.containers"),
        (lambda p: p["metadata"].update(annotations={"flightrec.io/port": "http"}), "not a port"),
        (lambda p: p["metadata"].update(annotations={"flightrec.io/port": "70000"}), "not a port"),
        (lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "two"}), "not a count"),
        (lambda p: p.update(status=[]), "status is list"),
    ],
)
def test_malformed_pods_are_named_errors(mutate: Any, needle: str) -> None:
    pod = copy.deepcopy(pods()[0])
    mutate(pod)
    with pytest.raises(PodFormatError, match=needle):
        engine_of_pod(pod)
    with pytest.raises(PodFormatError):
        engine_of_pod("not a pod")


def test_one_name_claimed_twice_is_told_apart() -> None:
    a, b = pods()[0], copy.deepcopy(pods()[0])
    b["metadata"].update(namespace="other", uid="u-2")
    engines = unique_names([engine_of_pod(a), engine_of_pod(b), engine_of_pod(pods()[1])])
    assert [e.name for e in engines] == ["inference/vllm-prefill-0", "other/vllm-prefill-0", "vllm-decode-0"]
