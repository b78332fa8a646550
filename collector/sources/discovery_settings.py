"""Engine discovery's settings (``collector.sources.discovery``), mounted in ``Settings`` as
``discovery:`` (``FLIGHTREC_DISCOVERY__MODE=kubernetes``, ``FLIGHTREC_DISCOVERY__NODE_NAME``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class DiscoverySettings(BaseModel):
    model_config = {"extra": "forbid"}

    mode: Literal["static", "kubernetes"] = Field(
        default="static", description="static: engines: only; kubernetes: also the vLLM pods on this node, followed as they come and go"
    )
    node_name: str = Field(default="", description="this node's name (the DaemonSet sets it from spec.nodeName)")
    label_selector: str = Field(default="flightrec.io/engine", description="which pods are engines (a Kubernetes label selector)")
    namespace: str = Field(default="", description="one namespace to look in; empty: all")
    api_url: str = Field(default="https://kubernetes.default.svc", description="the API server, as pods reach it")
    token_file: Path = Field(default=SERVICE_ACCOUNT / "token", description="the service account's token (re-read: it rotates)")
    ca_file: Path | None = Field(default=SERVICE_ACCOUNT / "ca.crt", description="the API server's CA; null: the system's")
    container: str = Field(default="vllm", description="the engine's container when the pod does not name it")
    port: int = Field(default=8000, gt=0, lt=65536, description="the engine's port when the container names none")
    log_root: Path = Field(default=Path("/var/log/pods"), description="where the kubelet keeps containers' logs (the node's, mounted read-only)")
    follow_logs: bool = Field(default=True, description="follow each engine container's log under log_root")
    watch_timeout_s: int = Field(default=300, ge=10, le=3600, description="a watch is renewed this often (from its last resourceVersion)")
    retry_s: float = Field(default=2.0, gt=0, description="first wait after the API server fails; doubles to 60 s")
    pod_resources: bool = Field(
        default=True, description="read which pod holds each GPU from the kubelet's PodResources API (needs grpcio: the kubernetes extra)"
    )
    pod_resources_socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"), description="the kubelet's PodResources socket (the node's, mounted read-only)"
    )
    pod_resources_interval_s: float = Field(default=5.0, gt=0, description="how often the PodResources map is listed again")
    forget_after_s: float = Field(default=60.0, ge=0, description="a deleted pod's engine is followed this long after (its last log lines)")

    @model_validator(mode="after")
    def _node_needed(self) -> DiscoverySettings:
        if self.mode == "kubernetes" and not self.node_name:
            raise ValueError("discovery.node_name is required with mode kubernetes (FLIGHTREC_DISCOVERY__NODE_NAME from spec.nodeName)")
        if not self.api_url.startswith(("http://", "https://")):
            raise ValueError("discovery.api_url must start with http:// or https://")
        return self
