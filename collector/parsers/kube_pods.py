"""What an engine is, read from a Kubernetes Pod object (the v1 API's JSON, as a list or a watch
event carries it). Pure: no I/O; the sources' Kubernetes client hands pods in.

One pod is one engine, named by the annotation ``flightrec.io/engine-name`` or else by the
pod's name (what ``FLIGHTREC_ENGINE_NAME`` gets from the downward API in the shipped vLLM pod,
so that the recorder's rings join it by name). From the pod:

- the **container** running vLLM: the annotation ``flightrec.io/container``, else the one named
  ``vllm``, else the first;
- the **URL**: ``http://<pod IP>:<port>``, the port being the annotation ``flightrec.io/port``,
  else that container's port named ``http``, else its first port, else the default (8000);
  no pod IP yet (pending): no URL, the engine is not followed until it has one;
- the **GPUs**: how many the container's ``nvidia.com/gpu`` limit asks for (the device plugin
  picks which; indices are learnt from NVML's process lists, as for any engine);
- the **P/D role**: the annotation ``flightrec.io/role``, else vLLM's ``--kv-transfer-config``
  ``kv_role`` (``kv_producer`` prefill, ``kv_consumer`` decode, ``kv_both`` both); the **pair**:
  the annotation ``flightrec.io/pair``;
- the **log folder**: ``<namespace>_<pod>_<uid>/<container>`` under the node's ``/var/log/pods``,
  where the kubelet keeps the container's output;
- whether it is **terminating** (``metadata.deletionTimestamp``): a pod being deleted stops on
  purpose, which is no engine death.

Malformed input raises ``PodFormatError`` (an ``InputError``), naming what is wrong.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from collector.errors import InputError

ENGINE_NAME_ANNOTATION = "flightrec.io/engine-name"
CONTAINER_ANNOTATION = "flightrec.io/container"
PORT_ANNOTATION = "flightrec.io/port"
ROLE_ANNOTATION = "flightrec.io/role"
PAIR_ANNOTATION = "flightrec.io/pair"
DEFAULT_CONTAINER = "vllm"
DEFAULT_PORT = 8000

_KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}


class PodFormatError(InputError):
    """A pod object that is not what the v1 API serves."""


@dataclass(frozen=True, slots=True)
class PodEngine:
    name: str
    namespace: str
    pod: str
    uid: str
    node: str | None
    container: str
    url: str | None  # None until the pod has an IP
    log_dir: str  # relative to the node's /var/log/pods
    gpus: int | None  # the container's nvidia.com/gpu limit; None when it asks for none
    role: str | None
    pair: str | None
    phase: str | None
    restarts: int
    terminating: bool

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def _obj(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodFormatError(f"{what} is {type(value).__name__}, not an object")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise PodFormatError(f"{what} missing or not a string")
    return value


def kv_role(args: list[str]) -> str | None:
    """The P/D role vLLM's ``--kv-transfer-config`` gives (``--flag JSON`` or ``--flag=JSON``)."""
    for i, arg in enumerate(args):
        value: str | None = None
        if arg == "--kv-transfer-config" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--kv-transfer-config="):
            value = arg.split("=", 1)[1]
        if value is None:
            continue
        try:
            cfg = json.loads(value)
        except ValueError:
            return None
        role = cfg.get("kv_role") if isinstance(cfg, dict) else None
        return _KV_ROLES.get(role) if isinstance(role, str) else None
    return None


def _words(container: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The container's command and args as given, and with each word split as a shell would
    (the script of a ``sh -c "exec vllm serve ..."``)."""
    given: list[str] = []
    for key in ("command", "args"):
        value = container.get(key) or []
        if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
            raise PodFormatError(f"container {key} is not a list of strings")
        given += value
    split: list[str] = []
    for word in given:
        try:
            split += shlex.split(word)
        except ValueError:
            split.append(word)
    return given, split


def _port(container: dict[str, Any], annotation: str | None, default: int) -> int:
    if annotation is not None:
        try:
            port = int(annotation)
        except ValueError:
            raise PodFormatError(f"annotation {PORT_ANNOTATION}={annotation!r} is not a port") from None
        if not 0 < port < 65536:
            raise PodFormatError(f"annotation {PORT_ANNOTATION}={annotation!r} is not a port")
        return port
    ports = container.get("ports") or []
    if not isinstance(ports, list):
        raise PodFormatError("container ports is not a list")
    numbers: list[tuple[object, int]] = [
        (p.get("name"), p["containerPort"]) for p in ports if isinstance(p, dict) and isinstance(p.get("containerPort"), int)
    ]
    for name, number in numbers:
        if name == "http":
            return number
    return numbers[0][1] if numbers else default


def _gpus(container: dict[str, Any]) -> int | None:
    limits = _obj(_obj(container.get("resources"), "container resources").get("limits"), "resource limits")
    value = limits.get("nvidia.com/gpu")
    if value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        raise PodFormatError(f"nvidia.com/gpu limit {value!r} is not a count") from None


def engine_of_pod(pod: Any, *, default_container: str = DEFAULT_CONTAINER, default_port: int = DEFAULT_PORT) -> PodEngine:
    """The engine a pod runs; see the module docstring."""
    pod = _obj(pod, "pod")
    meta = _obj(pod.get("metadata"), "metadata")
    spec = _obj(pod.get("spec"), "spec")
    status = _obj(pod.get("status"), "status")
    name = _str(meta.get("name"), "metadata.name")
    namespace = _str(meta.get("namespace"), "metadata.namespace")
    uid = _str(meta.get("uid"), "metadata.uid")
    annotations = _obj(meta.get("annotations"), "metadata.annotations")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise PodFormatError(f"pod {namespace}/{name}: spec.containers missing or malformed")
    wanted = annotations.get(CONTAINER_ANNOTATION) or default_container
    chosen = next((c for c in containers if c.get("name") == wanted), containers[0])
    container = _str(chosen.get("name"), "container name")
    ip = status.get("podIP")
    port = _port(chosen, annotations.get(PORT_ANNOTATION), default_port)
    host = f"[{ip}]" if isinstance(ip, str) and ":" in ip else ip
    restarts = 0
    for cs in status.get("containerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == container and isinstance(cs.get("restartCount"), int):
            restarts = cs["restartCount"]
    given, split = _words(chosen)
    role = annotations.get(ROLE_ANNOTATION) or kv_role(given) or kv_role(split)
    engine_name = annotations.get(ENGINE_NAME_ANNOTATION) or name
    node = spec.get("nodeName")
    return PodEngine(
        name=str(engine_name),
        namespace=namespace,
        pod=name,
        uid=uid,
        node=node if isinstance(node, str) else None,
        container=container,
        url=f"http://{host}:{port}" if isinstance(ip, str) and ip else None,
        log_dir=f"{namespace}_{name}_{uid}/{container}",
        gpus=_gpus(chosen),
        role=str(role) if role else None,
        pair=str(annotations[PAIR_ANNOTATION]) if annotations.get(PAIR_ANNOTATION) else None,
        phase=status.get("phase") if isinstance(status.get("phase"), str) else None,
        restarts=restarts,
        terminating=meta.get("deletionTimestamp") is not None,
    )


def unique_names(engines: list[PodEngine]) -> list[PodEngine]:
    """Two pods of one node claiming one engine name (the same name in two namespaces, or one
    annotation on two replicas) are told apart as ``<namespace>/<pod>``."""
    count: dict[str, int] = {}
    for e in engines:
        count[e.name] = count.get(e.name, 0) + 1
    out = []
    for e in engines:
        if count[e.name] > 1:
            e = PodEngine(**{**e.to_dict(), "name": f"{e.namespace}/{e.pod}"})
        out.append(e)
    return out
