"""The engine-side recorder API on its own (no vLLM): what a simulator or another engine writes
is what the sidecar's reader decodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.channel.blocks import RequestRecords
from collector.channel.codec import FLAG_KEPT, REQS_HEAD, STEP_HEAD, decode
from collector.channel.ringfile import RingReader
from collector.model import Event, Fingerprint, StepRecord, WorkloadArrival, WorkloadBatch, WorkloadEnd
from collector.recorder import EngineIdentity, RequestRecorder, StatsRecorder, engine_name, status_code
from tests.request_columns import rows_of

STEP = {
    "running": 4,
    "waiting": 7,
    "deferred": 2,
    "kv_cache_usage": 0.032,
    "preemptions": 0,
    "prompt_tokens": 300,
    "generation_tokens": 4,
    "finished": 1,
    "prefix_cache_queries": 640,
    "prefix_cache_hits": 128,
}


def records(path: Path) -> list[tuple[dict[str, Any] | None, Any]]:
    requests = RequestRecords()
    return [decode(p, requests=requests) for p in RingReader(path).read()]


def test_engine_names() -> None:
    assert engine_name(None, 0, 4242) == "vllm-4242"
    assert engine_name(None, 2, 4242) == "vllm-4242/dp2"
    assert engine_name("decode-0", 1, 4242) == "decode-0/dp1"
    assert EngineIdentity.from_env(server_pid=7, environ={"FLIGHTREC_ENGINE_NAME": "d"}).engine == "d"
    assert EngineIdentity.from_env(server_pid=7, environ={}).engine == "vllm-7"


def test_meta_and_fingerprint_carry_the_joining_facts(tmp_path: Path) -> None:
    ident = EngineIdentity(server_pid=4242, engine_index=1, server_host="127.0.0.1", server_port=8001, engine_version="0.32.0")
    rec = StatsRecorder(ident, directory=tmp_path, pid=99, clock=lambda: 5.0)
    rec.write_fingerprint({"block_size": 64})
    assert rec.channel.path.name == "vllm-4242%2Fdp1.stats.99.ring"
    (meta, _), (_, fp) = records(rec.channel.path)
    assert meta is not None
    joining = {"engine_index": 1, "server_pid": 4242, "server_host": "127.0.0.1", "server_port": 8001, "name_from": "server_pid"}
    assert {k: meta[k] for k in joining} == joining
    assert (meta["engine"], meta["role"], meta["pid"], meta["vllm_version"]) == ("vllm-4242/dp1", "stats", 99, "0.32.0")
    assert isinstance(fp, Fingerprint) and fp.ts == 5.0
    assert fp.facts == {"block_size": 64, **joining}


def test_a_step_round_trips(tmp_path: Path) -> None:
    rec = StatsRecorder(EngineIdentity(server_pid=1), directory=tmp_path)
    rec.write_step(812, ts=1.5, **STEP, extras={"connector": {"NixlConnector.num_failed_transfers": 1}})
    _, step = records(rec.channel.path)[1]
    assert isinstance(step, StepRecord)
    assert (step.step, step.ts, step.running, step.waiting, step.kv_cache_usage) == (812, 1.5, 4, 7, 0.032)
    assert step.waiting_by_reason == {"capacity": 5, "deferred": 2}
    assert (step.prompt_tokens, step.generation_tokens, step.finished) == (300, 4, 1)
    assert step.connector == {"NixlConnector.num_failed_transfers": 1}


def test_unknown_step_fields_are_named_not_zeroed(tmp_path: Path) -> None:
    rec = StatsRecorder(EngineIdentity(server_pid=1), directory=tmp_path)
    rec.write_step(3, **{**STEP, "kv_cache_usage": None, "prefix_cache_hits": None}, extras={"null": ["worker"]})
    rec.write_step(4, **STEP)
    raw = RingReader(rec.channel.path).read()
    extras = json.loads(raw[1][1 + STEP_HEAD.size :])
    assert extras == {"null": ["kv_cache_usage", "prefix_cache_hits", "worker"]}
    assert len(raw[2]) == 1 + STEP_HEAD.size  # a step with every field known carries no JSON


def test_request_columns_from_lists_and_from_bytes_are_the_same_record(tmp_path: Path) -> None:
    from array import array

    rec = RequestRecorder(EngineIdentity(server_pid=1), directory=tmp_path)
    cols: dict[str, Any] = {
        "ids": ["cmpl-a-0", "cmpl-é-1"],
        "prompt_len": [32000, 300],
        "computed": [32512, 0],
        "output": [512, 0],
        "preemptions": [0, 2],
        "status": [status_code("running"), status_code("preempted")],
        "mirror_rows": [8, -1],
    }
    rec.write_requests(77, ts=3.5, n=2, **cols)
    as_bytes = {k: array("i" if k == "mirror_rows" else "I", v).tobytes() for k, v in cols.items() if k not in ("ids", "status")}
    rec.write_requests(77, ts=3.5, n=2, ids="\0".join(cols["ids"]).encode(), status=bytes(cols["status"]), **as_bytes)
    raw = RingReader(rec.channel.path).read()
    # the second keeps the first's running set (equal columns): read in order, the same record
    assert raw[2][21] == raw[1][21] | FLAG_KEPT and len(raw[2]) == 1 + REQS_HEAD.size + 2 * 12
    requests = RequestRecords()
    first, second = requests.block(raw[1]), requests.block(raw[2])
    assert first is not None and second is not None and first.payload() == second.payload() == raw[1]
    assert [(r.request_id, r.prompt_len, r.computed_tokens, r.preemptions, r.status, r.mirror_rows) for r in rows_of(raw[1])] == [
        ("cmpl-a-0", 32000, 32512, 0, "running", 8),
        ("cmpl-é-1", 300, 0, 2, "preempted", None),
    ]


def test_host_blocks_column_sets_its_flag(tmp_path: Path) -> None:
    from collector.channel.codec import FLAG_HOST_BLOCKS, FLAG_MIRROR

    rec = RequestRecorder(EngineIdentity(server_pid=1), directory=tmp_path)
    one = {"n": 1, "ids": ["a"], "prompt_len": [1], "computed": [1], "output": [0], "preemptions": [0], "status": [0]}
    rec.write_requests(1, **one)
    rec.write_requests(2, **one, host_blocks=[5])
    rec.write_requests(3, **one, mirror_rows=[4], host_blocks=[-1])
    rec.write_requests(4, **{**one, "ids": ["b"]}, mirror_rows=[4], host_blocks=[-1])
    flags = [REQS_HEAD.unpack_from(p, 1)[3] for p in RingReader(rec.channel.path).read()[1:]]
    assert flags == [0, FLAG_HOST_BLOCKS | FLAG_KEPT, FLAG_MIRROR | FLAG_HOST_BLOCKS | FLAG_KEPT, FLAG_MIRROR | FLAG_HOST_BLOCKS]
    kept, full = RingReader(rec.channel.path).read()[-2:]
    assert kept.endswith(b"\x01\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\xff\xff\xff\xff")  # computed, output, mirror, host: no ids
    assert full.endswith(b"\x04\x00\x00\x00\xff\xff\xff\xffb")  # mirror, then host blocks, then ids


def test_workload_and_event_records(tmp_path: Path) -> None:
    rec = RequestRecorder(EngineIdentity(server_pid=1, server_port=8000), directory=tmp_path, clock=lambda: 9.0)
    rec.write_arrival("cmpl-1", ts=1.0, prompt_len=32000, max_tokens=2000, n=1, ignore_eos=True, has_stop=False)
    rec.write_end("cmpl-1", output_len=2000, finish="length", cached_tokens=None)
    rec.write_event("cuda_error", "CUDA error: unspecified launch failure", severity="critical", pid=3107)
    _, arrive = records(rec.channel.path)[1]
    _, end = records(rec.channel.path)[2]
    _, ev = records(rec.channel.path)[3]
    assert isinstance(arrive, WorkloadBatch) and isinstance(end, WorkloadBatch)
    assert arrive.records == [WorkloadArrival("cmpl-1", 1.0, 32000, 2000, 1, True, False)]
    assert end.records == [WorkloadEnd("cmpl-1", 9.0, 2000, "length", None)]  # cached tokens unknown: null, not 0
    assert isinstance(ev, Event) and (ev.kind.value, ev.pid, ev.ts) == ("cuda_error", 3107, 9.0)


def test_a_fault_disables_the_recorder_once_and_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = RequestRecorder(EngineIdentity(server_pid=1), directory=tmp_path)
    bad = {"n": 1, "ids": ["a"], "prompt_len": [-5], "computed": [1], "output": [0], "preemptions": [0], "status": [0]}
    rec.write_requests(1, **bad)  # a negative u32: the recorder's fault, not the engine's
    rec.write_requests(2, **{**bad, "prompt_len": [5]})
    assert not rec.active and rec.failed is not None and "write_requests" in rec.failed
    assert len([r for r in caplog.records if "disabled" in r.getMessage()]) == 1
    assert len(RingReader(rec.channel.path).read()) == 1  # the meta record only


def test_an_unwritable_folder_disables_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = StatsRecorder(EngineIdentity(server_pid=1), directory=blocker / "sub")
    rec.write_step(1, **STEP)
    assert not rec.active and rec.failed is not None and "cannot create" in rec.failed


def test_the_pod_uid_comes_from_the_downward_api_else_the_own_cgroup(tmp_path: Path) -> None:
    uid = "7f3c2b1a-9d4e-4c5f-8a6b-0e1d2c3b4a59"
    cg = tmp_path / "cgroup"
    cg.write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope\n"
    )
    from_env = EngineIdentity.from_env(server_pid=1, environ={"FLIGHTREC_POD_UID": "0F6B2C4D-8E1A-3B5C-7D9E-0F1A2B3C4D5E"}, cgroup_file=cg)
    assert from_env.pod_uid == "0f6b2c4d-8e1a-3b5c-7d9e-0f1a2b3c4d5e"  # the downward API wins
    from_cgroup = EngineIdentity.from_env(server_pid=1, environ={}, cgroup_file=cg)
    assert from_cgroup.pod_uid == uid
    assert from_cgroup.facts()["pod_uid"] == uid
    # outside a pod (or a cgroup namespace that shows "/"), or an unreadable file: no pod, no key
    cg.write_text("0::/\n")
    bare = EngineIdentity.from_env(server_pid=1, environ={}, cgroup_file=cg)
    assert bare.pod_uid is None and "pod_uid" not in bare.facts()
    assert EngineIdentity.from_env(server_pid=1, environ={}, cgroup_file=tmp_path / "missing").pod_uid is None
    # and the ring's meta record carries it, for the sidecar's join
    rec = StatsRecorder(from_cgroup, directory=tmp_path / "rings", pid=7)
    (meta, _), *_ = records(rec.channel.path)
    assert meta is not None and meta["pod_uid"] == uid


def test_the_meta_record_follows_every_wrap_of_the_ring(tmp_path: Path) -> None:
    rec = RequestRecorder(EngineIdentity(server_pid=7), directory=tmp_path, capacity=4096)
    reader = RingReader(rec.channel.path)
    requests = RequestRecords()
    metas, laps = 0, 0
    steps: list[int] = []
    for step in range(1, 600):
        rec.write_requests(step, ts=1.0, n=1, ids=["a"], prompt_len=[1], computed=[step], output=[0], preemptions=[0], status=[0])
        for payload in reader.read():  # a reader that keeps up sees every record
            meta, _ = decode(payload, requests=requests)
            if meta is not None and meta.get("t") == "meta":
                metas += 1
                assert not steps or steps[-1] == step  # first, then right after the record that crossed a lap
            else:
                steps.append(step)
        laps = rec.channel._ring.head // 4096  # type: ignore[union-attr]
    assert laps >= 5 and reader.lost_bytes == 0
    assert metas == 1 + laps  # the first, and one each time the head passed a multiple of the capacity
