"""Finding an engine's processes over fake /proc trees: the same pid namespace (a bare process),
the node's (a DaemonSet with hostPID: every container has a pid 1), and what cannot be found."""

from __future__ import annotations

from pathlib import Path

from collector.stacks import finder, roles
from tests.stacks import fakeproc

SERVER = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]


def _engine_tree(root: Path, base: int, *, ns: int | None = None, maps: str = "", tp: int = 2) -> None:
    """vLLM's tree: the API server, its engine core, the engine core's workers, a resource tracker."""

    def nspid(i: int) -> tuple[int, ...] | None:
        return None if ns is None else (base + i, ns + i)

    fakeproc.add(root, base, ppid=1, cmdline=SERVER, nspid=nspid(0), maps=maps)
    fakeproc.add(root, base + 1, ppid=base, cmdline=["VLLM::EngineCore"], name="VLLM::EngineCor", nspid=nspid(1))
    for r in range(tp):
        fakeproc.add(root, base + 2 + r, ppid=base + 1, cmdline=[f"VLLM::Worker_TP{r}"], name="VLLM::Worker_TP", nspid=nspid(2 + r))
    fakeproc.add(
        root, base + 10, ppid=base, cmdline=["/usr/bin/python3", "-c", "from multiprocessing.resource_tracker import main;main(9)"], nspid=nspid(10)
    )


def test_a_bare_engine_is_found_with_every_role(tmp_path: Path) -> None:
    _engine_tree(tmp_path, 100)
    fakeproc.add(tmp_path, 300, ppid=1, cmdline=["/usr/bin/python3", "other.py"])  # not the engine's
    found = finder.find("decode-0", {"server_pid": 100, "engine_core_pid": 101}, recorder_dir=None, proc=tmp_path)
    assert found.reason is None and found.notes == []
    got = [(p.role, p.pid, p.title) for p in found.processes]
    assert got == [
        (roles.ENGINE_CORE, 101, "VLLM::EngineCore"),
        (roles.WORKER, 102, "VLLM::Worker_TP0"),
        (roles.WORKER, 103, "VLLM::Worker_TP1"),
        (roles.API_SERVER, 100, " ".join(SERVER)),
        (roles.HELPER, 110, "/usr/bin/python3 -c from multiprocessing.resource_tracker import main;main(9)"),
    ]


def test_in_the_nodes_pid_namespace_the_ring_file_tells_the_containers_apart(tmp_path: Path) -> None:
    rings = tmp_path / "recorder"
    rings.mkdir()
    ours, theirs = rings / "decode-0.stats.1.ring", rings / "prefill-0.stats.1.ring"
    ours.write_bytes(b"\0" * 64)
    theirs.write_bytes(b"\0" * 64)
    proc = tmp_path / "proc"
    fakeproc.add(proc, 1, ppid=0, cmdline=["/sbin/init"], name="systemd")  # the node's own pid 1
    _engine_tree(proc, 5000, ns=1, maps=fakeproc.ring_map(ours))
    _engine_tree(proc, 6000, ns=1, maps=fakeproc.ring_map(theirs))  # another engine's pod
    found = finder.find("decode-0", {"server_pid": 1, "pid": 1}, recorder_dir=rings, proc=proc)
    assert found.reason is None
    assert sorted(p.pid for p in found.processes) == [5000, 5001, 5002, 5003, 5010]
    core = next(p for p in found.processes if p.role == roles.ENGINE_CORE)
    assert (core.pid, core.own_pid) == (5001, 2)
    assert any("its pid 1 is 5000 here" in n for n in found.notes)


def test_containers_that_cannot_be_told_apart_are_a_reason(tmp_path: Path) -> None:
    _engine_tree(tmp_path, 5000, ns=1)
    _engine_tree(tmp_path, 6000, ns=1)
    found = finder.find("decode-0", {"server_pid": 1}, recorder_dir=None, proc=tmp_path)
    assert found.processes == []
    assert found.reason is not None and "2 processes see themselves as pid 1" in found.reason


def test_an_engine_the_sidecar_cannot_see(tmp_path: Path) -> None:
    fakeproc.add(tmp_path, 40, ppid=1, cmdline=["/usr/bin/python3", "other.py"])
    found = finder.find("decode-0", {"server_pid": 4242}, recorder_dir=None, proc=tmp_path)
    assert found.processes == [] and found.reason is not None and "hostPID" in found.reason


def test_an_engine_without_a_recorder_has_no_pids(tmp_path: Path) -> None:
    found = finder.find("decode-0", {}, recorder_dir=None, proc=tmp_path)
    assert found.processes == [] and found.reason is not None and "recorder" in found.reason


def test_the_engine_core_alone_when_the_server_is_gone(tmp_path: Path) -> None:
    _engine_tree(tmp_path, 100)
    (tmp_path / "100" / "status").unlink()  # the API server exited; its engine core lives on
    found = finder.find("decode-0", {"server_pid": 100, "engine_core_pid": 101}, recorder_dir=None, proc=tmp_path)
    assert [p.role for p in found.processes] == [roles.ENGINE_CORE, roles.WORKER, roles.WORKER]


def test_a_tree_past_the_bound_is_cut_and_says_so(tmp_path: Path) -> None:
    _engine_tree(tmp_path, 100, tp=8)
    found = finder.find("decode-0", {"server_pid": 100}, recorder_dir=None, proc=tmp_path, max_processes=4)
    assert len(found.processes) == 4
    assert any("more than 4 processes" in n for n in found.notes)


def test_seeds_from_either_side_of_the_fingerprint() -> None:
    assert finder.seeds_of({"server_pid": 10, "engine_core_pid": 11, "pid": 10}) == {"server": 10, "engine_core": 11}
    assert finder.seeds_of({"server_pid": 10, "pid": 11}) == {"server": 10, "engine_core": 11}  # written by the engine core alone
    assert finder.seeds_of({"server_pid": True, "pid": "x"}) == {}
