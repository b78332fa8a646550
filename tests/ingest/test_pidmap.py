from __future__ import annotations

from pathlib import Path

from collector.ingest.hub import hub_for
from collector.ingest.pidmap import PidMap, owner
from collector.model import Event, EventKind, Fingerprint, GpuSample, Severity
from collector.procfs import parent_pid
from collector.settings import EngineConfig, Settings
from collector.snapshot.freeze import freeze
from collector.storage.writer import BatchWriter
from tests.wiring import with_committer


def fake_proc(root: Path, tree: dict[int, int]) -> Path:
    """A /proc with a status file per pid: {pid: parent}."""
    for pid, ppid in tree.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "status").write_text(f"Name:\tpython3\nState:\tS\nPid:\t{pid}\nPPid:\t{ppid}\n")
    return root


# API server 100 -> engine core 150 -> workers 300, 301 (decode); API server 200 -> 250 -> 400 (prefill)
TREE = {100: 1, 150: 100, 300: 150, 301: 150, 200: 1, 250: 200, 400: 250, 999: 1}


def test_a_worker_belongs_to_the_engine_up_its_process_tree(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, TREE)
    engines = {100: "decode-0", 200: "prefill-0"}
    assert parent_pid(301, proc) == 150
    assert owner(301, engines, proc) == "decode-0"
    assert owner(400, engines, proc) == "prefill-0"
    assert owner(999, engines, proc) is None  # some other process
    assert owner(12345, engines, proc) is None  # gone
    pm = PidMap(proc)
    assert pm.engine_of(300, engines) == "decode-0"
    (proc / "300" / "status").unlink()  # the worker died: the cache still knows it
    assert pm.engine_of(300, engines) == "decode-0"


def test_an_xid_goes_to_the_engine_of_its_pid_and_gpus_are_learnt(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, TREE)
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://d"), EngineConfig(name="prefill-0", url="http://p")])
    hub, committer = with_committer(settings, None, proc_root=proc, spool_dir=tmp_path / "spool", settle_s=5.0, window_s=60.0)
    hub.emit(Fingerprint(engine="decode-0", ts=0.0, facts={"pid": 100}))
    hub.emit(Fingerprint(engine="prefill-0", ts=0.0, facts={"pid": 200}))
    hub.emit(GpuSample(gpu="GPU-0", index=0, ts=1.0, bus_id="0000:00:05.0", processes=[{"pid": 400, "used_memory": 1}]))
    hub.emit(GpuSample(gpu="GPU-1", index=1, ts=1.0, bus_id="0000:00:06.0", processes=[{"pid": 300, "used_memory": 1}]))
    assert hub.view.engine("decode-0").gpus == {1} and hub.view.engine("prefill-0").gpus == {0}
    # named by its pid
    hub.emit(Event(kind=EventKind.XID, ts=2.0, source="kmsg", message="Xid 43", xid=43, gpu="0000:00:06.0", pid=301, severity=Severity.WARNING))
    # no pid (NVML's report of another fault): routed by the learnt GPU
    hub.emit(Event(kind=EventKind.XID, ts=9.0, source="nvml", message="Xid 31", xid=31, gpu="0000:00:05.0", severity=Severity.WARNING))
    assert [o.engine for o in committer.ledger.recent()] == ["decode-0", "prefill-0"]
    assert sorted(o.engine for o in committer.ledger.still_open()) == ["decode-0", "prefill-0"] and committer.backlog == 2
    doc = freeze(hub.view, "decode-0", Event(kind=EventKind.MANUAL, ts=2.0, source="api", message="m"))
    assert {s["gpu"] for s in doc.gpu_samples} == {"GPU-1"}


def test_malformed_process_lists_are_ignored_not_fatal(tmp_path: Path) -> None:
    writer = BatchWriter(None, interval=1.0)  # type: ignore[arg-type]  # never run: its queue only
    hub = hub_for(Settings(engines=[EngineConfig(name="decode-0", url="http://d")]), rows=writer, proc_root=fake_proc(tmp_path, TREE))
    hub.emit(Fingerprint(engine="decode-0", ts=0.0, facts={"pid": 100}))
    hub.emit(GpuSample(gpu="GPU-1", index=1, ts=1.0, processes=[{"pid": "x"}, {"used_memory": 3}, "junk"]))  # type: ignore[list-item]
    assert writer.pending_rows == 1 and hub.view.engine("decode-0").gpus == set()
    assert hub.view.dropped == 0  # the sample itself was filed


POD_A = "7f3c2b1a-9d4e-4c5f-8a6b-0e1d2c3b4a59"
POD_B = "0e1d2c3b-4a59-4c5f-8a6b-7f3c2b1a9d4e"


def _in_pod(proc: Path, pid: int, cgroup: str) -> None:
    (proc / str(pid) / "cgroup").write_text(cgroup)


def test_in_kubernetes_an_xid_goes_to_the_engine_of_its_pids_pod(tmp_path: Path) -> None:
    # Each engine runs in its own pod, where `vllm serve` is pid 1: the recorders' pids say
    # nothing of the node's pids. The node's pids 5000 (pod A's worker, cgroup v2, systemd) and
    # 6000 (pod B's worker, cgroup v1, cgroupfs, CRI-O) name their pods through their cgroups.
    proc = fake_proc(tmp_path, {5000: 4990, 4990: 4980, 6000: 5990, 5990: 5980, 7000: 1})
    cid = "ab" * 32
    _in_pod(
        proc, 5000, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_A.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    )
    _in_pod(proc, 6000, f"11:memory:/kubepods/besteffort/pod{POD_B}/crio-{cid}\n1:name=systemd:/kubepods/besteffort/pod{POD_B}/crio-{cid}\n")
    _in_pod(proc, 7000, "0::/system.slice/containerd.service\n")  # the node's own process
    hub, committer = with_committer(Settings(), None, proc_root=proc, spool_dir=tmp_path / "spool", settle_s=5.0, window_s=60.0)
    # pod A as discovery registers it (its UID from the API server); pod B's engine is known from
    # its recorder alone (its fingerprint says its pod), with a second data-parallel engine
    hub.intake.engine("vllm-a", url="http://10.0.0.5:8000", configured=True, pod_uid=POD_A)
    hub.emit(Fingerprint(engine="vllm-a", ts=0.0, facts={"server_pid": 1}))
    hub.emit(Fingerprint(engine="vllm-b", ts=0.0, facts={"server_pid": 1, "pod_uid": POD_B}))
    hub.emit(Fingerprint(engine="vllm-b/dp1", ts=0.0, facts={"server_pid": 1, "engine_index": 1, "pod_uid": POD_B}))
    # NVML's process lists (node pids): which GPUs each pod's engines use
    hub.emit(GpuSample(gpu="GPU-0", index=0, ts=1.0, bus_id="0000:00:05.0", processes=[{"pid": 5000, "used_memory": 1}]))
    hub.emit(GpuSample(gpu="GPU-1", index=1, ts=1.0, bus_id="0000:00:06.0", processes=[{"pid": 6000, "used_memory": 1}, {"pid": 7000}]))
    assert hub.view.engine("vllm-a").gpus == {0} and hub.view.engine("vllm-b").gpus == {1}
    hub.emit(Event(kind=EventKind.XID, ts=2.0, source="kmsg", message="Xid 79", xid=79, gpu="0000:00:06.0", pid=6000, severity=Severity.CRITICAL))
    assert sorted(o.engine for o in committer.ledger.recent()) == ["vllm-b", "vllm-b/dp1"]
    # a pid in no pod is no engine's: the GPU decides (GPU 0 is pod A's)
    hub.emit(Event(kind=EventKind.XID, ts=9.0, source="kmsg", message="Xid 31", xid=31, gpu="0000:00:05.0", pid=7000, severity=Severity.WARNING))
    assert sorted(o.engine for o in committer.ledger.recent()) == ["vllm-a", "vllm-b", "vllm-b/dp1"]
    assert hub.intake.engines.pids.pod_of(5000) == POD_A and hub.intake.engines.pids.pod_of(7000) is None
