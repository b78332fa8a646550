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
