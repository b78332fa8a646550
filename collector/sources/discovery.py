"""Engines found, not listed: the vLLM pods on this node, followed as they come and go.

``KubernetesDiscovery`` lists the pods whose ``spec.nodeName`` is this node and whose labels
match the selector (``flightrec.io/engine`` by default), then watches them from the list's
``resourceVersion``; a watch the server ends is renewed from the last version seen (bookmarks
included), and ``410 Gone`` lists again. Each pod is one engine (``collector.parsers.kube_pods``)
and gets what a configured engine gets:

- a ``/metrics`` and ``/health`` scrape at its pod IP (``VllmMetricsSource`` of that engine);
- its container's log followed where the kubelet keeps it (CRI folder under ``log_root``),
  from its start for a pod that appears while the sidecar runs, from the end for one already
  running when the sidecar starts;
- its name in the recorder's join, so its ring files join it by name;
- its name, URL and pair registered with ingest (when the sink is the hub).

Which GPUs each engine holds comes from the kubelet's PodResources API
(``collector.sources.pod_resources``: the device plugin's allocation to the pod, UUIDs mapped to
NVML's indices through the GPU samples), else from dcgm-exporter's GPU -> pod map; both are
registered with ingest so that a GPU's Xid goes to the engines on it, and the holders of every
GPU (engines or not) are handed to ingest for the fault's event and the incident page. A pod the
last list did not show is asked for with ``Get``.

Each runs under its own ``SupervisedSource``; their statuses are this source's (``/healthz``).
A pod being deleted (``deletionTimestamp``) stops being scraped at once (an engine stopped on
purpose is no engine death); its log is followed until ``forget_after_s`` after the pod is gone,
for its last lines. A pod whose uid, IP or container changes is followed anew.

The API server failing (down, 403, a malformed answer) never stops what is followed: the last
known engines go on, the source reports itself down with the reason, and it retries with a
backoff (``retry_s`` doubling to 60 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from collector.model import SourceStatus
from collector.parsers.kube_pods import PodEngine, PodFormatError, engine_of_pod, unique_names
from collector.sources.base import Sink
from collector.sources.join import EngineJoin
from collector.sources.kube_api import Gone, KubeApi, KubeApiError
from collector.sources.pod_resources import PodResourcesSource
from collector.sources.supervisor import SupervisedSource
from collector.tasks import Backoff

log = logging.getLogger(__name__)

MetricsFactory = Callable[[PodEngine], Any]
GpuPods = Callable[[], Mapping[int, tuple[str, str]]]  # GPU index -> (namespace, pod): dcgm-exporter's map
LogFactory = Callable[[PodEngine, bool], Any]  # (engine, from_start) -> a source, or None


@runtime_checkable
class EngineRegistry(Protocol):
    """What ingest offers to name an engine before its first record."""

    def engine(self, name: str, **attrs: Any) -> Any: ...


def registry_of(sink: Any) -> EngineRegistry | None:
    """Where to register an engine's facts: the sink itself, or its intake (ingest split into
    intake and routing); None when the sink is neither (a test's list)."""
    for candidate in (sink, getattr(sink, "intake", None)):
        if candidate is not None and isinstance(candidate, EngineRegistry):
            return candidate
    return None


@dataclass
class _Followed:
    engine: PodEngine
    metrics: SupervisedSource | None = None
    logs: SupervisedSource | None = None
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    gone_at: float | None = None
    gpu_indices: list[int] | None = None  # from PodResources, else dcgm-exporter's GPU -> pod map
    gpu_devices: list[dict[str, Any]] | None = None  # the kubelet's devices of the pod (PodResources)
    gpus_from: str | None = None  # "pod_resources" or "dcgm"


class KubernetesDiscovery:
    name = "discovery"

    def __init__(
        self,
        api: KubeApi,
        *,
        node: str,
        label_selector: str,
        namespace: str = "",
        container: str = "vllm",
        port: int = 8000,
        metrics_factory: MetricsFactory,
        log_factory: LogFactory | None = None,
        join: EngineJoin | None = None,
        gpu_pods: GpuPods | None = None,
        pod_resources: PodResourcesSource | None = None,
        watch_timeout_s: int = 300,
        retry_s: float = 2.0,
        forget_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.node = node
        self.label_selector = label_selector
        self.namespace = namespace
        self.container = container
        self.port = port
        self.metrics_factory = metrics_factory
        self.log_factory = log_factory
        self.join = join
        self.gpu_pods = gpu_pods
        self.pod_resources = pod_resources
        self._holders_told: dict[str, list[dict[str, Any]]] | None = None
        self.watch_timeout_s = watch_timeout_s
        self.forget_after_s = forget_after_s
        self.clock = clock
        self.backoff = Backoff(retry_s, 60.0)
        self.pods: dict[str, PodEngine] = {}  # uid -> engine, as the API last told
        self.followed: dict[str, _Followed] = {}  # uid -> what runs for it
        self.resource_version = ""
        self.api_up: bool | None = None
        self.last_error = ""
        self.last_ok: float | None = None
        self.lists = 0
        self.watches = 0
        self.relists_gone = 0
        self.bad_pods = 0
        self._listed_once = False
        self._sink: Sink | None = None
        # engines whose pod is being deleted or is gone (the last 1000): no longer scraped, so
        # their last "up" is stale; /metrics leaves them out rather than report it forever
        self.gone: dict[str, float] = {}

    # -- status ------------------------------------------------------------------------
    def status(self) -> list[SourceStatus]:
        own = SourceStatus(
            name=self.name,
            up=bool(self.api_up),
            reason=self.last_error if not self.api_up else "",
            last_ok=self.last_ok,
            errors=0 if self.api_up else 1,
            details={
                "mode": "kubernetes",
                "node": self.node,
                "label_selector": self.label_selector,
                "namespace": self.namespace or None,
                "resource_version": self.resource_version,
                "lists": self.lists,
                "watches": self.watches,
                "relists_410": self.relists_gone,
                "bad_pods": self.bad_pods,
                "gone": sorted(self.gone),
                "engines": [
                    {
                        **f.engine.to_dict(),
                        "followed": f.gone_at is None,
                        "scraped": f.metrics is not None,
                        "gpu_indices": f.gpu_indices,
                        "gpu_devices": f.gpu_devices,
                        "gpus_from": f.gpus_from,
                    }
                    for f in self.followed.values()
                ],
            },
        )
        out = [own]
        for f in self.followed.values():
            for sup in (f.metrics, f.logs):
                if sup is not None:
                    out += sup.statuses()
        return out

    def engines(self) -> list[PodEngine]:
        return [f.engine for f in self.followed.values() if f.gone_at is None]

    # -- running -----------------------------------------------------------------------
    async def run(self, sink: Sink) -> None:
        self._sink = sink
        reaper = asyncio.create_task(self._reap(), name="discovery reaper")
        try:
            async with self.api.client() as client:
                while True:
                    try:
                        await self._list_and_watch(client)
                    except Gone:
                        self.relists_gone += 1  # the version is too old: list again at once
                    except KubeApiError as exc:
                        self._failed(str(exc))
                        await asyncio.sleep(self.backoff.after_failure(0.0))
        finally:
            reaper.cancel()
            for uid in list(self.followed):
                self._stop(uid)
            await asyncio.gather(reaper, return_exceptions=True)

    async def _list_and_watch(self, client: Any) -> None:
        items, rv = await self.api.list_pods(client, node=self.node, label_selector=self.label_selector, namespace=self.namespace)
        self.lists += 1
        self._ok()
        seen: dict[str, PodEngine] = {}
        for obj in items:
            engine = self._parse(obj)
            if engine is not None:
                seen[engine.uid] = engine
        self.pods = seen
        self.resource_version = rv
        self._reconcile(from_start=self._listed_once)
        self._listed_once = True
        while True:
            self.watches += 1
            async for kind, obj in self.api.watch_pods(
                client,
                node=self.node,
                label_selector=self.label_selector,
                resource_version=self.resource_version,
                namespace=self.namespace,
                timeout_s=self.watch_timeout_s,
            ):
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if rv:
                    self.resource_version = rv
                self._ok()
                if kind == "BOOKMARK":
                    continue
                engine = self._parse(obj)
                if engine is None:
                    continue
                if kind == "DELETED":
                    self.pods.pop(engine.uid, None)
                elif kind in ("ADDED", "MODIFIED"):
                    self.pods[engine.uid] = engine
                self._reconcile(from_start=True)
            # the server ended the watch (timeoutSeconds): renew it from the last version

    def _parse(self, obj: Any) -> PodEngine | None:
        try:
            engine = engine_of_pod(obj, default_container=self.container, default_port=self.port)
        except PodFormatError as exc:
            self.bad_pods += 1
            log.warning("discovery: a pod the API server listed is not understood (%s): skipped", exc)
            return None
        if engine.node is not None and engine.node != self.node:  # the field selector said otherwise
            return None
        return engine

    def _ok(self) -> None:
        if self.api_up is False:
            log.warning("discovery: the API server answers again")
        self.api_up, self.last_error, self.last_ok = True, "", time.time()
        self.backoff.current = self.backoff.min_s

    def _failed(self, reason: str) -> None:
        if self.api_up is not False or reason != self.last_error:
            log.warning("discovery: %s; the engines found so far are still followed, retrying", reason)
        self.api_up, self.last_error = False, reason

    # -- what runs per engine ----------------------------------------------------------
    def _reconcile(self, *, from_start: bool) -> None:
        now = self.clock()
        desired = {e.uid: e for e in unique_names(sorted(self.pods.values(), key=lambda e: (e.namespace, e.pod)))}
        for uid, f in list(self.followed.items()):
            want = desired.get(uid)
            if want is None:
                if f.gone_at is None:
                    f.gone_at = now  # the pod is gone: no scrape; the log for its last lines
                    self._stop_metrics(f)
                    self._mark_gone(f.engine.name)
                    if self.join is not None:
                        self.join.discard(f.engine.name)
                    log.info("discovery: engine %s (pod %s/%s) is gone", f.engine.name, f.engine.namespace, f.engine.pod)
                continue
            if (want.name, want.url, want.log_dir) != (f.engine.name, f.engine.url, f.engine.log_dir):
                self._stop(uid)
                continue
            f.engine = want
            if want.terminating and f.metrics is not None:
                self._stop_metrics(f)
                self._mark_gone(want.name)
        for uid, engine in desired.items():
            if uid not in self.followed and engine.url is not None:
                self._start(engine, from_start=from_start)

    def _mark_gone(self, name: str) -> None:
        """The engine stopped on purpose: no longer scraped. Ingest is told it is not up, so the
        detectors do not read the end of its scrapes as a target gone (a page on every rollout)."""
        registry = registry_of(self._sink)
        if registry is not None:
            registry.engine(name, up=False)
        self.gone[name] = time.time()
        while len(self.gone) > 1000:
            del self.gone[min(self.gone, key=self.gone.__getitem__)]

    def _start(self, engine: PodEngine, *, from_start: bool) -> None:
        assert self._sink is not None
        self.gone.pop(engine.name, None)  # a pod of that name again (a StatefulSet's)
        f = self.followed[engine.uid] = _Followed(engine)
        sink = self._sink
        registry = registry_of(sink)
        if registry is not None:
            registry.engine(engine.name, url=engine.url, pair=engine.pair, configured=True, pod_uid=engine.uid)
        if self.join is not None:
            self.join.add(engine)
        if engine.terminating:
            self._mark_gone(engine.name)
        else:
            f.metrics = SupervisedSource(self.metrics_factory(engine))
            f.tasks["metrics"] = asyncio.create_task(f.metrics.run(sink), name=f"discovery metrics {engine.name}")
        if self.log_factory is not None:
            src = self.log_factory(engine, from_start)
            if src is not None:
                f.logs = SupervisedSource(src)
                f.tasks["logs"] = asyncio.create_task(f.logs.run(sink), name=f"discovery log {engine.name}")
        log.info(
            "discovery: engine %s (pod %s/%s, %s, role %s, %s GPU(s))",
            engine.name,
            engine.namespace,
            engine.pod,
            engine.url,
            engine.role or "unknown",
            engine.gpus if engine.gpus is not None else "no",
        )

    def _stop_metrics(self, f: _Followed) -> None:
        task = f.tasks.pop("metrics", None)
        if task is not None:
            task.cancel()
        f.metrics = None

    def _stop(self, uid: str) -> None:
        f = self.followed.pop(uid, None)
        if f is None:
            return
        for task in f.tasks.values():
            task.cancel()
        if self.join is not None and f.gone_at is None:
            self.join.discard(f.engine.name)

    def map_gpus(self) -> None:
        """Which GPUs each engine uses: the kubelet's PodResources allocation to its pod, else
        dcgm-exporter's GPU -> pod map (where NVML's process lists are not read); registered
        with ingest, so that a GPU's Xid goes to its engine. The holders of every GPU go to
        ingest too, for the fault's event."""
        registry = registry_of(self._sink)
        pr = self.pod_resources if self.pod_resources is not None and self.pod_resources.ready else None
        index_of = _gpu_index_of(registry)
        by_pod: dict[tuple[str, str], list[int]] = {}
        if self.gpu_pods is not None:
            for index, pod in self.gpu_pods().items():
                by_pod.setdefault(pod, []).append(index)
        for f in self.followed.values():
            if f.gone_at is not None:
                continue
            key = (f.engine.namespace, f.engine.pod)
            devices = pr.of_pod(*key) if pr is not None else []
            if devices:
                found = [(h, index_of(h.gpu)) for h in devices]
                indices = sorted({i for _, i in found if i is not None})
                f.gpu_devices = [{**h.to_dict(), "index": i} for h, i in found]
                f.gpus_from = "pod_resources"
            else:
                indices = sorted(by_pod.get(key, []))
                f.gpus_from = "dcgm" if indices else f.gpus_from
            if indices and indices != f.gpu_indices:
                f.gpu_indices = indices
                if registry is not None:
                    registry.engine(f.engine.name, gpus=indices)
        if pr is not None:
            holders = {gpu: [h.to_dict() for h in hs] for gpu, hs in pr.by_gpu().items()}
            setter = getattr(registry, "set_gpu_holders", None)
            if holders != self._holders_told and callable(setter):
                setter(holders)
                self._holders_told = holders

    async def _ask_new_pods(self) -> None:
        """Engines the last PodResources list did not show (a pod just started): ``Get`` each once."""
        pr = self.pod_resources
        if pr is None or not pr.ready:
            return
        for f in list(self.followed.values()):
            if f.gone_at is None and pr.wants(f.engine.namespace, f.engine.pod):
                await pr.get(f.engine.namespace, f.engine.pod)

    async def _reap(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self._ask_new_pods()
            except Exception:  # noqa: BLE001 - the map from the last list stays
                log.exception("discovery: asking the kubelet for a new pod's devices failed")
            self.map_gpus()
            now = self.clock()
            for uid, f in list(self.followed.items()):
                if f.gone_at is not None and now - f.gone_at >= self.forget_after_s:
                    self._stop(uid)


def _gpu_index_of(registry: Any) -> Callable[[str], int | None]:
    """A GPU id as the kubelet gives it -> NVML's index: an index as is
    (``deviceIDStrategy: index``), a UUID through the GPU samples ingest holds; None when no
    sample names it yet (a MIG device, or before the first GPU poll)."""
    store = getattr(registry, "store", None)
    lookup = getattr(store, "gpu_index", None)

    def index_of(gpu: str) -> int | None:
        if gpu.isdigit():
            return int(gpu)
        found = lookup(gpu) if callable(lookup) else None
        return found if isinstance(found, int) else None

    return index_of
