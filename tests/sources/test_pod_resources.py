"""The kubelet's PodResources API, for real: a gRPC server built from the kubelet's published
api.proto (the checked-in stubs' server half) on a Unix socket, answering List and Get as the
kubelet does for the NVIDIA device plugin's allocations (UUIDs, MIG, time-sliced replicas,
indices, DRA), and the source that reads it."""

from __future__ import annotations

import asyncio
import filecmp
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from collector.sources.base import SourceUnsupported  # noqa: E402
from collector.sources.pod_resources import DeviceHolder, PodResourcesSource, holders_of  # noqa: E402
from collector.sources.podresources import api_pb2 as pb  # noqa: E402
from collector.sources.podresources import api_pb2_grpc as pb_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GPU0 = "GPU-4a1b7c2d-0e3f-5a6b-7c8d-9e0f1a2b3c4d"
GPU1 = "GPU-5b2c8d3e-1f4a-6b7c-8d9e-0f1a2b3c4d5e"
MIG = "MIG-6c3d9e4f-2a5b-7c8d-9e0f-1a2b3c4d5e6f"


def node_pods() -> list[Any]:
    """What the kubelet lists on a GPU node: two engines, a MIG tenant, a CPU-only pod with
    other devices, a time-sliced pair and a DRA claim."""
    return [
        pb.PodResources(
            name="vllm-decode-0",
            namespace="inference",
            containers=[
                pb.ContainerResources(
                    name="vllm",
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu", device_ids=[GPU0, GPU1], topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])
                        )
                    ],
                    cpu_ids=[2, 3],
                ),
                pb.ContainerResources(name="log-shipper"),
            ],
        ),
        pb.PodResources(
            name="notebook",
            namespace="research",
            containers=[pb.ContainerResources(name="main", devices=[pb.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=[MIG])])],
        ),
        pb.PodResources(
            name="dpdk",
            namespace="net",
            containers=[
                pb.ContainerResources(name="fwd", devices=[pb.ContainerDevices(resource_name="intel.com/sriov", device_ids=["0000:3b:02.1"])])
            ],
        ),
        pb.PodResources(
            name="shared-a",
            namespace="batch",
            containers=[
                pb.ContainerResources(
                    name="w",
                    devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-7d4e0f5a-3b6c-8d9e-0f1a-2b3c4d5e6f70::3"])],
                )
            ],
        ),
        pb.PodResources(
            name="dra-engine",
            namespace="inference",
            containers=[
                pb.ContainerResources(
                    name="vllm",
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_name="gpu",
                            claim_namespace="inference",
                            claim_resources=[
                                pb.ClaimResource(
                                    driver_name="gpu.nvidia.com",
                                    pool_name="node-1",
                                    device_name="gpu-3",
                                    cdi_devices=[pb.CDIDevice(name="k8s.gpu.nvidia.com/device=gpu-3")],
                                )
                            ],
                        )
                    ],
                )
            ],
        ),
    ]


class Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.pods = node_pods()
        self.calls: list[str] = []
        self.fail: Any = None

    async def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's name
        self.calls.append("List")
        if self.fail is not None:
            await context.abort(self.fail, "kubelet says no")
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    async def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(f"Get {request.pod_namespace}/{request.pod_name}")
        for p in self.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=p)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")


@asynccontextmanager
async def kubelet(sock: Path) -> AsyncIterator[Kubelet]:
    server = grpc.aio.server()
    k = Kubelet()
    pb_grpc.add_PodResourcesListerServicer_to_server(k, server)
    assert server.add_insecure_port(f"unix://{sock}") == 1
    await server.start()
    try:
        yield k
    finally:
        await server.stop(None)


def run(fn: Callable[[], Any]) -> Any:
    return asyncio.run(fn())


def test_holders_of_keeps_gpus_and_says_who_holds_them() -> None:
    got = holders_of(node_pods())
    assert got == [
        DeviceHolder(GPU0, "nvidia.com/gpu", "inference", "vllm-decode-0", "vllm"),
        DeviceHolder(GPU1, "nvidia.com/gpu", "inference", "vllm-decode-0", "vllm"),
        DeviceHolder(MIG, "nvidia.com/mig-1g.10gb", "research", "notebook", "main"),
        DeviceHolder("GPU-7d4e0f5a-3b6c-8d9e-0f1a-2b3c4d5e6f70::3", "nvidia.com/gpu", "batch", "shared-a", "w"),
        DeviceHolder("gpu-3", "gpu.nvidia.com", "inference", "dra-engine", "vllm"),
    ]
    assert got[3].gpu == "GPU-7d4e0f5a-3b6c-8d9e-0f1a-2b3c4d5e6f70"  # the replica's GPU


def test_list_over_the_unix_socket_and_get_for_a_pod_not_listed(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"

    async def main() -> None:
        async with kubelet(sock) as k:
            src = PodResourcesSource(sock, interval=0.05, timeout=2.0)
            task = asyncio.create_task(src.run(None))  # type: ignore[arg-type]  # it emits nothing
            for _ in range(200):
                if src.ready:
                    break
                await asyncio.sleep(0.01)
            assert src.ready and src.status().up
            by_gpu = src.by_gpu()
            assert [(h.namespace, h.pod, h.container) for h in by_gpu[GPU1]] == [("inference", "vllm-decode-0", "vllm")]
            assert "0000:3b:02.1" not in by_gpu  # not a GPU
            assert [h.device for h in src.of_pod("inference", "vllm-decode-0")] == [GPU0, GPU1]
            # a new engine pod the last list did not show: Get asks the kubelet for it alone
            k.pods.append(
                pb.PodResources(
                    name="vllm-new",
                    namespace="inference",
                    containers=[pb.ContainerResources(name="vllm", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["3"])])],
                )
            )
            assert src.wants("inference", "vllm-new")
            got = await src.get("inference", "vllm-new")
            assert got == [DeviceHolder("3", "nvidia.com/gpu", "inference", "vllm-new", "vllm")]
            assert not src.wants("inference", "vllm-new") and src.by_gpu()["3"][0].pod == "vllm-new"
            # an error to Get (no such pod, or a kubelet without the Get feature gate) is counted, no failure
            assert await src.get("inference", "no-such-pod") is None and src.status().up
            assert src.status().details["get_errors"] == 1 and "NOT_FOUND" in src.status().details["last_get_error"]
            assert "Get inference/vllm-new" in k.calls
            # the kubelet failing: down with the reason, the map last read kept
            k.fail = grpc.StatusCode.PERMISSION_DENIED
            lists = src.lists
            while src.lists < lists + 2:
                await asyncio.sleep(0.01)
            st = src.status()
            assert not st.up and "PERMISSION_DENIED" in st.reason and src.by_gpu()[GPU0]
            k.fail = None
            while not src.status().up:
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run(main)


def test_no_socket_is_down_with_the_reason(tmp_path: Path) -> None:
    async def main() -> None:
        src = PodResourcesSource(tmp_path / "absent.sock", interval=0.01)
        task = asyncio.create_task(src.run(None))  # type: ignore[arg-type]
        while src.lists < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        st = src.status()
        assert not st.up and "no socket at" in st.reason and not src.ready

    run(main)


def test_without_grpcio_the_source_is_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError

    async def main() -> None:
        src = PodResourcesSource(tmp_path / "kubelet.sock")
        with pytest.raises(SourceUnsupported, match="grpcio"):
            await src.run(None)  # type: ignore[arg-type]
        assert not src.status().supported

    run(main)


def test_the_checked_in_stubs_are_what_the_proto_generates(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    rel = "collector/sources/podresources/api.proto"
    (tmp_path / rel).parent.mkdir(parents=True)
    shutil.copy(ROOT / rel, tmp_path / rel)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.", "--grpc_python_out=.", rel],
        cwd=tmp_path,
        check=True,
    )
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        assert filecmp.cmp(tmp_path / "collector/sources/podresources" / name, ROOT / "collector/sources/podresources" / name, shallow=False), name


def test_discovery_routes_a_gpus_xid_to_the_pod_holding_it_and_names_the_holders(tmp_path: Path) -> None:
    """Three engine pods on a node: the kubelet gives vllm-decode-0 GPUs 0 and 1 (by UUID); dcgm's
    map (the fallback) is all that speaks for vllm-prefill-0; nothing says which GPU the third
    uses. An Xid naming GPU 0 by its bus id goes to vllm-decode-0 alone (without PodResources it
    would go to every engine whose GPUs are not known), and its event names the pod and container
    holding that GPU."""
    import json

    from collector.ingest.hub import hub_for
    from collector.model import Event, EventKind, GpuSample, Severity
    from collector.parsers.kube_pods import engine_of_pod
    from collector.settings import load_settings
    from collector.sources.discovery import KubernetesDiscovery, _Followed
    from collector.sources.kube_api import KubeApi

    pods = json.loads((ROOT / "tests" / "fixtures" / "kubernetes" / "podlist-gpu-node-a.json").read_text())["items"]
    sock = tmp_path / "kubelet.sock"

    async def main() -> None:
        async with kubelet(sock) as k:
            hub = hub_for(load_settings())
            filed: list[Event] = []
            hub.router.consumers = (*hub.router.consumers, lambda ev, new: filed.append(ev))
            k.pods[0].name = "vllm-decode-0"
            src = PodResourcesSource(sock, interval=60.0)
            task = asyncio.create_task(src.run(hub))
            while not src.ready:
                await asyncio.sleep(0.01)
            d = KubernetesDiscovery(
                KubeApi("http://127.0.0.1:9"),
                node="gpu-node-a",
                label_selector="",
                metrics_factory=lambda e: None,
                gpu_pods=lambda: {2: ("inference", "vllm-prefill-0"), 1: ("inference", "vllm-prefill-0")},
                pod_resources=src,
            )
            d._sink = hub
            for obj in pods[:3]:
                engine = engine_of_pod(obj)
                d.followed[engine.uid] = _Followed(engine)
                hub.intake.engine(engine.name, url=engine.url, configured=True, pod_uid=engine.uid)
            for i, uuid in enumerate((GPU0, GPU1, "GPU-other")):
                hub.emit(GpuSample(gpu=uuid, index=i, ts=1.0, bus_id=f"0000:0{i}:00.0"))
            d.map_gpus()
            assert hub.view.engine("vllm-decode-0").gpus == {0, 1}  # type: ignore[union-attr]
            assert hub.view.engine("vllm-prefill-0").gpus == {1, 2}  # type: ignore[union-attr]  # dcgm's (stale) map
            engines = {e["pod"]: e for e in d.status()[0].details["engines"]}
            assert engines["vllm-decode-0"]["gpus_from"] == "pod_resources" and engines["vllm-prefill-0"]["gpus_from"] == "dcgm"
            assert [x["index"] for x in engines["vllm-decode-0"]["gpu_devices"]] == [0, 1]
            hub.emit(Event(kind=EventKind.XID, ts=2.0, source="kmsg", message="Xid 79", xid=79, gpu="0000:00:00.0", severity=Severity.CRITICAL))
            ev = filed[-1]
            assert ev.data["gpu_holders"] == [
                {"device": GPU0, "resource": "nvidia.com/gpu", "namespace": "inference", "pod": "vllm-decode-0", "container": "vllm"}
            ]
            assert [e.uid for e in hub.intake.store.of("vllm-decode-0").events] == [ev.uid]
            assert not hub.intake.store.of("vllm-prefill-0").events and not hub.intake.store.of("qwen-small-7c9f8d-xk2lp").events
            # a new engine pod the list did not show is asked for once with Get
            k.pods.append(pb.PodResources(name="vllm-decode-1", namespace="inference"))
            d.followed["u3"] = _Followed(engine_of_pod({**pods[3], "status": {"podIP": "10.0.0.9"}}))
            await d._ask_new_pods()
            await d._ask_new_pods()
            assert k.calls.count("Get inference/vllm-decode-1") == 1
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run(main)


CLIENT = """
import asyncio, sys
from pathlib import Path
from collector.sources.pod_resources import PodResourcesSource

async def main():
    src = PodResourcesSource(Path(sys.argv[1]))
    src._connect()
    ok = await src.list_once()
    print(ok, src.status().reason, sorted(src.by_gpu()))
    try:
        (Path(sys.argv[1]).parent / "probe").write_text("x")
        print("writable")
    except OSError as exc:
        print("errno", exc.errno)

asyncio.run(main())
"""


def test_the_socket_answers_through_a_read_only_mount(tmp_path: Path) -> None:
    """As the DaemonSet mounts it: the node's pod-resources folder bound read-only (a mount
    namespace of the test's own, through unshare); connecting to the socket writes nothing."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no unshare -rm here (user and mount namespaces)")
    node, mounted = tmp_path / "node-pod-resources", tmp_path / "var-lib-kubelet-pod-resources"
    node.mkdir()
    mounted.mkdir()

    async def main() -> str:
        async with kubelet(node / "kubelet.sock"):
            script = f'mount --bind -o ro "{node}" "{mounted}" && exec "{sys.executable}" -c "$0" "{mounted}/kubelet.sock"'
            proc = await asyncio.create_subprocess_exec(
                "unshare", "-rm", "sh", "-c", script, CLIENT, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            return out.decode()

    out = run(main)
    first, second = out.splitlines()
    assert first.startswith("True") and GPU0 in first and MIG in first
    assert second == "errno 30"  # EROFS: the mount is read-only, and List answered through it


def test_a_restarted_kubelet_is_read_again_within_seconds(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"

    async def main() -> None:
        src = PodResourcesSource(sock, interval=0.1, timeout=1.0)
        async with kubelet(sock):
            task = asyncio.create_task(src.run(None))  # type: ignore[arg-type]
            while not src.ready:
                await asyncio.sleep(0.01)
        # the kubelet is gone (its socket with it), then back on a new socket at the same path
        while src.status().up:
            await asyncio.sleep(0.01)
        assert GPU0 in src.by_gpu()  # the map last read is kept meanwhile
        sock.unlink(missing_ok=True)
        async with kubelet(sock) as k:
            k.pods = k.pods[1:2]  # the node changed meanwhile
            t0 = asyncio.get_running_loop().time()
            while not (src.status().up and GPU0 not in src.by_gpu()):
                assert asyncio.get_running_loop().time() - t0 < 8.0, src.status()
                await asyncio.sleep(0.05)
            assert list(src.by_gpu()) == [MIG]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run(main)
