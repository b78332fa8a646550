"""Kubernetes discovery against a stand-in API server over real HTTP, answering with pods written in the v1 API's shape
(tests/sources/kubeapi_fake.py: no kube-apiserver can be installed here), with the real
httpx client, the real metrics scrape (engines: loopback servers serving a captured vLLM page)
and the real hub: pods found on the node become engines, a pod added while running is followed,
a deleted one stops being scraped, a 410 relists, a bookmark's version is watched from, an API
server that fails leaves the engines followed."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from collector.ingest.hub import Hub, hub_for
from collector.parsers.kube_pods import PodEngine
from collector.settings import EngineConfig, load_settings
from collector.sources.discovery import KubernetesDiscovery
from collector.sources.join import EngineJoin
from collector.sources.kube_api import KubeApi
from collector.sources.vllm_metrics import VllmMetricsSource
from tests.sources.kubeapi_fake import RecordedApi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PODS = json.loads((FIXTURES / "kubernetes" / "podlist-gpu-node-a.json").read_text())
PAGE = (FIXTURES / "vllm-metrics" / "load-running-waiting.txt").read_bytes()


async def vllm_stub() -> tuple[asyncio.AbstractServer, int]:
    """An engine at 127.0.0.1:<port>: /metrics serves a captured vLLM page, /health 200."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                body = PAGE if path.startswith(b"/metrics") else b""
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def on_loopback(pod: dict[str, Any], port: int, rv: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["status"]["podIP"] = "127.0.0.1"
    pod["metadata"]["annotations"]["flightrec.io/port"] = str(port)
    pod["metadata"]["resourceVersion"] = rv
    return pod


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


def scrapes(hub: Hub, name: str) -> int:
    return len(hub.view.scrapes(name))


def discovery(api: RecordedApi, token: Path, join: EngineJoin, logs: list[tuple[str, bool]]) -> KubernetesDiscovery:
    def metrics(e: PodEngine) -> Any:
        assert e.url is not None
        return VllmMetricsSource(engines=[EngineConfig(name=e.name, url=e.url)], interval=0.05, timeout=1.0)

    def log_factory(e: PodEngine, from_start: bool) -> None:
        logs.append((e.name, from_start))  # which logs would be followed, and from where

    return KubernetesDiscovery(
        KubeApi(api.url, token_file=token),
        node="gpu-node-a",
        label_selector="flightrec.io/engine",
        metrics_factory=metrics,
        log_factory=log_factory,
        join=join,
        retry_s=0.05,
        forget_after_s=0.2,
    )


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def test_engines_found_followed_and_forgotten(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token-1\n")

    async def body() -> None:
        servers = [await vllm_stub() for _ in range(3)]
        (_, p1), (_, p2), (_, p3) = servers
        prefill, decode, small, pending = PODS["items"]
        prefill, decode, small = on_loopback(prefill, p1, "100"), on_loopback(decode, p2, "101"), on_loopback(small, p3, "102")
        first = {**PODS, "metadata": {"resourceVersion": "110"}, "items": [prefill, decode, pending]}
        deleting = copy.deepcopy(decode)
        deleting["metadata"].update(deletionTimestamp="2026-12-03T09:00:00Z", resourceVersion="121")
        relisted = {**PODS, "metadata": {"resourceVersion": "200"}, "items": [prefill, small]}
        api = RecordedApi(
            lists=[first, relisted],
            watches=[
                [
                    {"type": "ADDED", "object": small},
                    0.3,
                    {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "150"}}},
                    {"type": "MODIFIED", "object": deleting},
                    0.3,
                    {"type": "DELETED", "object": deleting},
                ],
                # renewed from the bookmark's version; the server then says it is too old
                [{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}}],
                ["hang"],
            ],
        )
        await api.start()
        hub = hub_for(load_settings())
        join = EngineJoin([])
        logs: list[tuple[str, bool]] = []
        d = discovery(api, token, join, logs)
        task = asyncio.create_task(d.run(hub))
        try:
            await until(lambda: scrapes(hub, "vllm-prefill-0") > 2 and scrapes(hub, "vllm-decode-0") > 0)
            # the pending pod (no IP) is not followed; the two running ones are, by pod name
            prefill = hub.view.engine("vllm-prefill-0")
            assert prefill is not None and prefill.url == f"http://127.0.0.1:{p1}" and prefill.pair == "pd-0"
            assert prefill.configured
            assert hub.view.engine("vllm-decode-1") is None
            # the one added while running, from its log's start; the first ones from the end
            await until(lambda: scrapes(hub, "qwen-small-7c9f8d-xk2lp") > 0)
            assert logs[:2] == [("vllm-decode-0", False), ("vllm-prefill-0", False)] and logs[2] == ("qwen-small-7c9f8d-xk2lp", True)
            # the decode pod is being deleted: no more scrapes of it
            await until(lambda: d.relists_gone == 1, timeout=15)
            frozen = scrapes(hub, "vllm-decode-0")
            await asyncio.sleep(0.3)
            assert scrapes(hub, "vllm-decode-0") == frozen
            assert "vllm-decode-0" not in join.names and {"vllm-prefill-0", "qwen-small-7c9f8d-xk2lp"} <= join.names
            assert d.status()[0].details["gone"] == ["vllm-decode-0"]  # /metrics leaves its stale state out
            # not up: the detectors do not take the end of its scrapes for a target gone
            assert hub.view.engine("vllm-decode-0").up is False  # type: ignore[union-attr]
            await until(lambda: {e.name for e in d.engines()} == {"vllm-prefill-0", "qwen-small-7c9f8d-xk2lp"})
            status = d.status()
            assert status[0].name == "discovery" and status[0].up and status[0].details["relists_410"] == 1
            assert {s.name for s in status[1:]} >= {"vllm_metrics:vllm-prefill-0", "vllm_metrics:qwen-small-7c9f8d-xk2lp"}
            await until(lambda: "vllm-decode-0" not in {e["name"] for e in d.status()[0].details["engines"]})  # forgotten
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.stop()
            for server, _ in servers:
                server.close()
        # what the API server was asked
        lists = [r for r in api.requests if "watch" not in r.query]
        watches = [r for r in api.requests if r.query.get("watch") == "1"]
        for r in api.requests:
            assert r.path == "/api/v1/pods"
            assert r.query["fieldSelector"] == "spec.nodeName=gpu-node-a" and r.query["labelSelector"] == "flightrec.io/engine"
            assert r.headers["authorization"] == "Bearer sa-token-1"
        assert len(lists) == 2
        assert [w.query["resourceVersion"] for w in watches[:3]] == ["110", "121", "200"]
        assert all(w.query["allowWatchBookmarks"] == "true" and w.query["timeoutSeconds"] == "300" for w in watches)

    run(body)


def test_a_failing_api_server_leaves_the_engines_followed(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t1")

    async def body() -> None:
        server, port = await vllm_stub()
        prefill = on_loopback(PODS["items"][0], port, "5")
        api = RecordedApi(lists=[{**PODS, "metadata": {"resourceVersion": "9"}, "items": [prefill]}], watches=[[0.2], [0.2]])
        await api.start()
        hub = hub_for(load_settings())
        d = discovery(api, token, EngineJoin([]), [])
        task = asyncio.create_task(d.run(hub))
        try:
            await until(lambda: scrapes(hub, "vllm-prefill-0") > 0)
            api.list_status = 403  # RBAC taken away: the next watch is refused
            token.write_text("t2")  # and the token rotated
            await until(lambda: d.api_up is False)
            [own, *_] = d.status()
            assert not own.up and "HTTP 403" in own.reason and "pods is forbidden" in own.reason
            n = scrapes(hub, "vllm-prefill-0")
            await until(lambda: scrapes(hub, "vllm-prefill-0") > n + 2)  # still scraped
            api.list_status = 200
            await until(lambda: d.api_up is True)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.stop()
            server.close()
        assert api.requests[-1].headers["authorization"] == "Bearer t2"  # the file is re-read

    run(body)


def test_settings_and_the_sources_table() -> None:
    import pytest

    from collector.settings import SettingsError
    from collector.sources.recorder import RecorderSource
    from collector.sources.registry import BUILDERS

    with pytest.raises(SettingsError, match="discovery: .*node_name is required"):
        load_settings(discovery={"mode": "kubernetes"})
    settings = load_settings(discovery={"mode": "kubernetes", "node_name": "gpu-node-a"}, recorder_dir="/tmp/flightrec-test-rings")
    built = BUILDERS["recorder"](settings)
    rec, disc, pods = built
    assert isinstance(rec, RecorderSource) and isinstance(disc, KubernetesDiscovery)
    assert disc.join is rec.join  # a discovered engine's rings join it by name
    # the kubelet's PodResources socket says which GPUs each engine holds
    assert disc.pod_resources is pods and str(pods.socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    off = load_settings(discovery={"mode": "kubernetes", "node_name": "n", "pod_resources": False})
    assert [type(s).__name__ for s in BUILDERS["recorder"](off)] == ["RecorderSource", "KubernetesDiscovery"]
    assert disc.node == "gpu-node-a" and disc.label_selector == "flightrec.io/engine"
    assert disc.api.base_url == "https://kubernetes.default.svc"
    assert disc.api.read_timeout == settings.discovery.watch_timeout_s + 30  # a dead connection is noticed
    # static: no discovery
    assert [type(s).__name__ for s in BUILDERS["recorder"](load_settings())] == ["RecorderSource"]


def test_the_engine_facts_go_to_whatever_of_ingest_registers_engines() -> None:
    from collector.sources.discovery import registry_of

    class Registry:
        def __init__(self) -> None:
            self.known: dict[str, dict[str, Any]] = {}

        def engine(self, name: str, **facts: Any) -> None:
            self.known[name] = facts

    class Split:  # a hub whose engines are registered by its intake
        def __init__(self) -> None:
            self.intake = Registry()

        def emit(self, item: object) -> None:
            pass

    direct, split = Registry(), Split()
    assert registry_of(direct) is direct and registry_of(split) is split.intake
    assert registry_of(type("ListSink", (), {"emit": lambda s, i: None})()) is None


def test_dcgm_exporters_gpu_to_pod_map_says_which_gpus_an_engine_uses() -> None:
    from collector.parsers.kube_pods import engine_of_pod
    from collector.sources.discovery import _Followed
    from collector.sources.registry import BUILDERS

    hub = hub_for(load_settings())
    gpu_pods = {2: ("inference", "vllm-prefill-0"), 3: ("inference", "vllm-prefill-0"), 5: ("other", "x")}
    d = KubernetesDiscovery(
        KubeApi("http://127.0.0.1:9"), node="gpu-node-a", label_selector="", metrics_factory=lambda e: None, gpu_pods=lambda: gpu_pods
    )
    d._sink = hub
    engine = engine_of_pod(PODS["items"][0])
    d.followed[engine.uid] = _Followed(engine)
    d.map_gpus()
    assert hub.view.engine("vllm-prefill-0").gpus == {2, 3}  # type: ignore[union-attr]  # a GPU's Xid now goes to this engine alone
    assert d.status()[0].details["engines"][0]["gpu_indices"] == [2, 3]
    # the settings wire the one dcgm-exporter source to discovery
    settings = load_settings(discovery={"mode": "kubernetes", "node_name": "n"}, gpu_metrics="dcgm", recorder="off")
    disc, pods, dcgm = BUILDERS["recorder"](settings)
    assert disc.pod_resources is pods and BUILDERS["dcgm"](settings) == []
    dcgm.gpu_pods = {0: ("ns", "p")}
    assert disc.gpu_pods() == {0: ("ns", "p")}
