"""Which pod and container holds each GPU, from the kubelet's PodResources API (``List`` and
``Get`` of ``v1.PodResourcesLister`` on the kubelet's Unix socket), as dcgm-exporter and NVIDIA
NVSentinel read it: the device plugin's allocation, not a guess from process lists.

Every ``interval`` the source lists the node's pods' devices and keeps, for each device whose
resource is a GPU's (``nvidia.com/gpu``, the MIG resources ``nvidia.com/mig-*``, any
``resource_prefixes``; DRA claims of a driver with those prefixes), who holds it. Discovery reads
that map (``collector.sources.discovery``) to register each engine's GPUs with ingest, and the GPU
half of Xid routing and the incident page name the holders. A pod that discovery has just found
and the last list did not show is asked for with ``Get``.

Device ids are what the device plugin gives: a GPU's UUID (``GPU-…``), a MIG device's
(``MIG-…``), a time-sliced replica's ``GPU-…::<n>`` (the GPU's UUID is the part before ``::``),
or an index (``deviceIDStrategy: index``).

``grpcio`` and ``protobuf`` are the ``kubernetes`` extra (the container image has them): without
them the source is reported unsupported, once, and dcgm-exporter's pod map is the fallback. The
socket missing or the kubelet not answering is reported down with the reason and retried; the map
last read is kept until a list succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.model import SourceStatus
from collector.sources.base import Sink, SourceUnsupported

log = logging.getLogger(__name__)

KUBELET_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
DRA_GPU_DRIVERS = ("gpu.nvidia.com",)
MAX_MESSAGE = 16 << 20  # a node of many pods: the kubelet's own limit is 16 MiB


@dataclass(frozen=True, slots=True)
class DeviceHolder:
    """One device, as the kubelet says it is allocated."""

    device: str  # the device id as given (GPU-…, MIG-…, GPU-…::1, "0", a DRA device name)
    resource: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, or a DRA driver name
    namespace: str
    pod: str
    container: str

    @property
    def gpu(self) -> str:
        """The GPU's id: a time-sliced replica's ``::<n>`` dropped."""
        return self.device.split("::", 1)[0]

    def to_dict(self) -> dict[str, str]:
        return {"device": self.device, "resource": self.resource, "namespace": self.namespace, "pod": self.pod, "container": self.container}


def _wanted(resource: str, prefixes: Sequence[str]) -> bool:
    return any(resource.startswith(p) for p in prefixes)


def holders_of(
    pods: Iterable[Any], prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES, dra_drivers: Sequence[str] = DRA_GPU_DRIVERS
) -> list[DeviceHolder]:
    """The GPU devices of ``PodResources`` messages (a ``List`` response's ``pod_resources``, or
    ``Get``'s one), in order: pure, no I/O."""
    out: list[DeviceHolder] = []
    for pod in pods:
        for c in pod.containers:
            for dev in c.devices:
                if _wanted(dev.resource_name, prefixes):
                    out += [DeviceHolder(str(i), dev.resource_name, pod.namespace, pod.name, c.name) for i in dev.device_ids]
            for dyn in c.dynamic_resources:
                for claim in dyn.claim_resources:
                    if claim.device_name and _wanted(claim.driver_name, dra_drivers):
                        out.append(DeviceHolder(claim.device_name, claim.driver_name, pod.namespace, pod.name, c.name))
    return out


def _stubs() -> tuple[Any, Any, Any]:
    """grpc, the messages and the service stub; SourceUnsupported without grpcio/protobuf."""
    try:
        import grpc

        from collector.sources.podresources import api_pb2, api_pb2_grpc
    except ImportError as exc:
        raise SourceUnsupported(
            f"the kubelet's PodResources API needs grpcio and protobuf ({exc}); install vllm-flight-recorder[kubernetes]"
        ) from None
    except RuntimeError as exc:  # the stubs' own check: a grpcio or protobuf older than they need
        raise SourceUnsupported(f"the kubelet's PodResources API: {exc}") from None
    return grpc, api_pb2, api_pb2_grpc


class PodResourcesSource:
    name = "pod_resources"

    def __init__(
        self,
        socket: Path = KUBELET_SOCKET,
        *,
        interval: float = 5.0,
        timeout: float = 2.0,
        resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket = Path(socket)
        self.interval = interval
        self.timeout = timeout
        self.prefixes = tuple(resource_prefixes)
        self.clock = clock
        self.up: bool | None = None
        self.supported = True
        self.last_error = ""
        self.last_ok: float | None = None
        self.lists = 0
        self.gets = 0
        self.get_errors = 0
        self.last_get_error = ""
        self.errors = 0
        self.holders: list[DeviceHolder] = []  # the last list's, plus pods asked for since
        self._stub: Any = None
        self._msgs: Any = None
        self._grpc: Any = None
        self._asked: set[tuple[str, str]] = set()

    # -- what others read ------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """A list has been read: the map is the kubelet's (an empty one means no GPU is held)."""
        return self.lists > 0 and self.last_ok is not None

    def of_pod(self, namespace: str, pod: str) -> list[DeviceHolder]:
        return [h for h in self.holders if h.namespace == namespace and h.pod == pod]

    def by_gpu(self) -> dict[str, list[DeviceHolder]]:
        """GPU id (UUID, or an index under ``deviceIDStrategy: index``) -> who holds it."""
        out: dict[str, list[DeviceHolder]] = {}
        for h in self.holders:
            out.setdefault(h.gpu, []).append(h)
        return out

    def status(self) -> SourceStatus:
        return SourceStatus(
            name=self.name,
            up=bool(self.up) if self.up is not None else True,
            supported=self.supported,
            reason=self.last_error if self.up is False or not self.supported else "",
            last_ok=self.last_ok,
            errors=self.errors,
            details={
                "socket": str(self.socket),
                "lists": self.lists,
                "gets": self.gets,
                "get_errors": self.get_errors,
                "last_get_error": self.last_get_error or None,
                "errors_total": self.errors,
                "last_error": self.last_error or None,
                "devices": [h.to_dict() for h in self.holders],
            },
        )

    # -- calls -------------------------------------------------------------------------------
    def _connect(self) -> Any:
        grpc, msgs, stubs = _stubs()
        self._grpc, self._msgs = grpc, msgs
        channel = grpc.aio.insecure_channel(
            f"unix://{self.socket}",
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.enable_retries", 0),
                # a restarted kubelet (an upgrade) is reached again within seconds, not gRPC's 2 min
                ("grpc.initial_reconnect_backoff_ms", 500),
                ("grpc.max_reconnect_backoff_ms", 5000),
            ],
        )
        self._stub = stubs.PodResourcesListerStub(channel)
        return channel

    async def list_once(self) -> bool:
        """One ``List``; True when the map is the kubelet's answer."""
        self.lists += 1
        try:
            resp = await self._stub.List(self._msgs.ListPodResourcesRequest(), timeout=self.timeout)
        except self._grpc.aio.AioRpcError as exc:
            self._failed(f"List: {exc.code().name}: {exc.details()}")
            return False
        self.holders = holders_of(resp.pod_resources, self.prefixes)
        self._ok()
        return True

    async def get(self, namespace: str, pod: str) -> list[DeviceHolder] | None:
        """One ``Get`` for a pod (one the last list did not show); its devices join the map.
        None when the kubelet does not answer (or knows no such pod)."""
        if self._stub is None:
            return None
        self.gets += 1
        if len(self._asked) > 10_000:
            self._asked.clear()
        self._asked.add((namespace, pod))  # once per pod: one without GPUs is never in the map
        try:
            resp = await self._stub.Get(self._msgs.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace), timeout=self.timeout)
        except self._grpc.aio.AioRpcError as exc:
            # not a failure of the source: a kubelet without the Get feature gate, or a pod it
            # does not know yet, is answered by the next List
            self.get_errors += 1
            self.last_get_error = f"Get {namespace}/{pod}: {exc.code().name}: {exc.details()}"
            return None
        got = holders_of([resp.pod_resources], self.prefixes)
        self.holders = [h for h in self.holders if (h.namespace, h.pod) != (namespace, pod)] + got
        return got

    def wants(self, namespace: str, pod: str) -> bool:
        """A pod to ask for with ``Get``: listed as an engine, absent from the map, not asked yet."""
        return self._stub is not None and (namespace, pod) not in self._asked and not self.of_pod(namespace, pod)

    def _ok(self) -> None:
        if self.up is False:
            log.warning("pod_resources: the kubelet answers again on %s", self.socket)
        self.up, self.last_error, self.last_ok = True, "", self.clock()

    def _failed(self, reason: str) -> None:
        self.errors += 1
        if self.up is not False or reason != self.last_error:
            log.warning("pod_resources: %s (%s); the GPU map last read is kept", reason, self.socket)
        self.up, self.last_error = False, reason

    async def run(self, sink: Sink) -> None:
        try:
            channel = self._connect()
        except SourceUnsupported as exc:
            self.supported, self.up, self.last_error = False, False, str(exc)
            raise
        try:
            while True:
                if not self.socket.exists():
                    self.lists += 1
                    self._failed(f"no socket at {self.socket} (mount the node's /var/lib/kubelet/pod-resources)")
                else:
                    await self.list_once()
                await asyncio.sleep(self.interval)
        finally:
            await channel.close(None)
