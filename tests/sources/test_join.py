from __future__ import annotations

from pathlib import Path

from procfake import fake_proc, tcp_row

from collector.settings import EngineConfig
from collector.sources.join import EngineJoin, Joined, listening_pids

ENGINES = [
    EngineConfig(name="decode-0", url="http://127.0.0.1:8000"),
    EngineConfig(name="prefill-0", url="http://localhost:8001/"),
    EngineConfig(name="remote-0", url="http://10.9.9.9:8002"),
]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_listening_pids_reads_listen_rows_and_socket_fds(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path, listeners={4242: (8000, 5551), 4343: (8001, 5552)}, other_rows=tcp_row(9, 8001, 7777, state="01")
    )  # an established one: not a listener
    assert listening_pids(8000, proc) == {4242}
    assert listening_pids(8001, proc) == {4343}
    assert listening_pids(9999, proc) == set()
    assert listening_pids(8000, tmp_path / "missing") == set()  # no /proc: nothing, no error


def test_listening_pids_reads_tcp6(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, listeners={4242: (8000, 5551)}, tcp6=True)
    assert listening_pids(8000, proc) == {4242}


def test_a_configured_name_joins_by_name(tmp_path: Path) -> None:
    j = EngineJoin(ENGINES, proc=fake_proc(tmp_path))
    assert j.resolve("decode-0") == Joined("decode-0", True, "name")
    assert j.resolve("decode-0/dp1") == Joined("decode-0/dp1", True, "name")


def test_the_meta_records_port_joins_one_local_url(tmp_path: Path) -> None:
    j = EngineJoin(ENGINES, proc=fake_proc(tmp_path))
    assert j.resolve("vllm-100", {"server_port": 8001}) == Joined("prefill-0", True, "port")
    assert j.resolve("vllm-100/dp2", {"server_port": 8000, "engine_index": 2}) == Joined("decode-0/dp2", True, "port")
    # a remote URL's port is no match for a local recorder
    assert j.resolve("vllm-100", {"server_port": 8002}) == Joined("vllm-100", False, "none")


def test_the_listening_process_joins_the_ring_named_by_its_pid(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, listeners={4242: (8000, 5551), 4343: (8001, 5552)})
    j = EngineJoin(ENGINES, proc=proc)
    assert j.resolve("vllm-4242") == Joined("decode-0", True, "listener")
    assert j.resolve("vllm-4343/dp1") == Joined("prefill-0/dp1", True, "listener")
    # the meta record's server_pid wins over the name's
    assert j.resolve("vllm-1", {"server_pid": 4343}) == Joined("prefill-0", True, "listener")


def test_a_listener_that_is_an_ancestor_of_the_server_pid_joins(tmp_path: Path) -> None:
    # the port is held by 4000; the recorder's API server 4242 is its child
    proc = fake_proc(tmp_path, listeners={4000: (8000, 5551)}, parents={4242: 4000, 4000: 1})
    assert EngineJoin(ENGINES, proc=proc).resolve("vllm-4242") == Joined("decode-0", True, "listener")


def test_no_match_keeps_the_recorders_name_unconfigured(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, listeners={4242: (8000, 5551)})
    j = EngineJoin(ENGINES, proc=proc)
    assert j.resolve("vllm-777") == Joined("vllm-777", False, "none")
    assert j.resolve("my-engine") == Joined("my-engine", False, "none")
    assert EngineJoin([], proc=proc).resolve("vllm-4242") == Joined("vllm-4242", False, "none")


def test_listener_lookups_are_cached_for_ttl(tmp_path: Path) -> None:
    clock = Clock()
    proc = fake_proc(tmp_path, listeners={4242: (8000, 5551)})
    j = EngineJoin(ENGINES, proc=proc, ttl=10.0, clock=clock)
    assert j.resolve("vllm-5000").configured is False
    # the engine binds its port now (pid 5000 listens on 8000)
    (proc / "net" / "tcp").write_text((proc / "net" / "tcp").read_text() + tcp_row(5, 8000, 6661))
    (proc / "5000" / "fd").mkdir(parents=True)
    (proc / "5000" / "fd" / "9").symlink_to("socket:[6661]")
    clock.now = 5.0
    assert j.resolve("vllm-5000").configured is False  # cached miss
    clock.now = 11.0
    assert j.resolve("vllm-5000") == Joined("decode-0", True, "listener")


def _pod(name: str, uid: str, ip: str) -> object:
    from collector.parsers.kube_pods import engine_of_pod

    return engine_of_pod(
        {
            "metadata": {"name": name, "namespace": "inference", "uid": uid},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": ip},
        }
    )


def test_a_discovered_pods_rings_join_it_by_pod_uid_without_ports(tmp_path: Path) -> None:
    # two engine pods, each its own pid 1 listening on 8000 in its own network namespace: the
    # port and the pid say nothing; the recorder's pod UID (downward API or cgroup) does
    j = EngineJoin([], proc=fake_proc(tmp_path))
    j.add(_pod("vllm-a", "11111111-2222-3333-4444-555555555555", "10.0.0.5"))
    j.add(_pod("vllm-b", "66666666-7777-8888-9999-000000000000", "10.0.0.6"))
    meta_b = {"server_pid": 1, "server_port": 8000, "pod_uid": "66666666-7777-8888-9999-000000000000"}
    assert j.resolve("vllm-1", meta_b) == Joined("vllm-b", True, "pod")
    assert j.resolve("vllm-1/dp1", {**meta_b, "engine_index": 1}) == Joined("vllm-b/dp1", True, "pod")
    # an unknown pod (not an engine of this node) stays unconfigured
    assert j.resolve("vllm-1", {"server_pid": 1, "pod_uid": "aaaaaaaa-2222-3333-4444-555555555555"}).configured is False
    # the pod is gone: its UID no longer joins
    j.discard("vllm-b")
    assert j.resolve("vllm-1", meta_b) == Joined("vllm-1", False, "none")
