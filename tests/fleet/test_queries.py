"""The fleet view's reads over one store written by several nodes: a hardware fault that follows
one GPU, a software fault that recurs on other GPUs and hosts, and the filters."""

from __future__ import annotations

import pytest

from collector.fleet.queries import FleetFilter, crash_groups, facets, fleet_incidents
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from tests.fleet.crashes import crash_doc, store

T = 1_796_000_000.0
HOUR = 3600.0


@pytest.fixture
def fleet(migrated_url: str) -> Repository:
    """Three nodes' sidecars writing to one store: node-a's GPU 0000:18:00.0 raises Xid 79 twice
    (an hour apart), whatever runs on it; the connector's CUDA error (Xid 43) hits node-b and
    node-c on different GPUs; node-c also runs another vLLM version."""
    db = make_engine(migrated_url)
    nodes = {h: Repository(db, host=h) for h in ("node-a", "node-b", "node-c")}
    store(nodes["node-a"], crash_doc("node-a", "decode-0", T, xid=79, gpu="0000:18:00.0", cuda=False))
    store(nodes["node-a"], crash_doc("node-a", "decode-1", T + HOUR, xid=79, gpu="0000:18:00.0", cuda=False, model="m-2"))
    store(nodes["node-b"], crash_doc("node-b", "decode-0", T + 2 * HOUR, xid=43, gpu="0000:9a:00.0"))
    store(nodes["node-c"], crash_doc("node-c", "decode-0", T + 3 * HOUR, xid=43, gpu="0000:18:00.0"))
    store(nodes["node-c"], crash_doc("node-c", "decode-0", T + 4 * HOUR, xid=43, gpu="0000:18:00.0", version="0.12.0"))
    # the P engine of node-b's pair in the same incident, same signature: one occurrence, not two
    store(nodes["node-b"], crash_doc("node-b", "prefill-0", T + 2 * HOUR + 1, xid=43, gpu="0000:9a:00.0"))
    return nodes["node-a"]


def by_pattern(groups: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    return {g["pattern"]: g for g in groups}


def test_a_hardware_fault_follows_its_gpu_and_a_software_fault_recurs_across_gpus(fleet: Repository) -> None:
    pats = by_pattern(crash_groups(fleet.db, FleetFilter()))
    assert sorted(pats) == ["follows_gpu", "once", "recurs_across_gpus"]
    hw = pats["follows_gpu"]  # two models ran on the GPU: one fault, the GPU's
    assert hw["suspect"] == "hardware" and hw["occurrences"] == 2 and hw["xid"] == 79
    assert hw["gpus"] == [{"host": "node-a", "gpu": "0000:18:00.0"}] and hw["engines"] == ["node-a/decode-0", "node-a/decode-1"]
    assert "0000:18:00.0" in hw["text"] and "node-a" in hw["text"]
    sw = pats["recurs_across_gpus"]  # vLLM 0.11.0 on node-b and node-c, node-b's P/D pair one incident
    assert sw["suspect"] == "software" and sw["occurrences"] == 2 and sw["snapshots"] == 3
    assert sw["hosts"] == ["node-b", "node-c"] and sw["vllm_version"] == "0.11.0"
    assert sw["gpus"] == [{"host": "node-b", "gpu": "0000:9a:00.0"}, {"host": "node-c", "gpu": "0000:18:00.0"}]
    assert sw["detail"]["cuda_error"] == "unspecified launch failure" and sw["detail"]["frames"]
    assert pats["once"]["vllm_version"] == "0.12.0"  # another version: another signature
    assert sw["signature"] != pats["once"]["signature"]


def test_the_pattern_follows_where_the_occurrences_fell(fleet: Repository) -> None:
    a = Repository(fleet.db, host="node-a")
    store(a, crash_doc("node-a", "decode-0", T + 5 * HOUR, xid=79, gpu="0000:18:00.0", cuda=False))
    store(a, crash_doc("node-a", "decode-0", T + 6 * HOUR, xid=79, gpu="0000:3b:00.0", cuda=False))  # another of its GPUs
    pats = by_pattern(crash_groups(fleet.db, FleetFilter(xid=79)))
    assert list(pats) == ["recurs_across_gpus"] and pats["recurs_across_gpus"]["occurrences"] == 4
    g = by_pattern(crash_groups(fleet.db, FleetFilter(xid=79, until=T + 5.5 * HOUR)))["follows_gpu"]
    assert g["occurrences"] == 3


@pytest.mark.parametrize(
    ("flt", "snapshots"),
    [
        (FleetFilter(host="node-c"), 2),
        (FleetFilter(xid=79), 2),
        (FleetFilter(vllm_version="0.12.0"), 1),
        (FleetFilter(model="m-2"), 1),
        (FleetFilter(engine="prefill-0"), 1),
        (FleetFilter(fault_class="hardware"), 2),
        (FleetFilter(since=T + 2.5 * HOUR), 2),
        (FleetFilter(host="node-z"), 0),
    ],
)
def test_filters(fleet: Repository, flt: FleetFilter, snapshots: int) -> None:
    assert sum(g["snapshots"] for g in crash_groups(fleet.db, flt)) == snapshots


def test_incidents_across_nodes_and_facets(fleet: Repository) -> None:
    incs = fleet_incidents(fleet.db, FleetFilter(xid=43))
    assert len(incs) == 3
    pair = next(i for i in incs if len(i["snapshot_ids"]) == 2)
    assert pair["hosts"] == ["node-b"] and pair["gpus"] == ["node-b/0000:9a:00.0"] and len(pair["signatures"]) == 1
    f = facets(fleet.db)
    assert f["host"] == ["node-a", "node-b", "node-c"] and f["xid"] == [43, 79] and f["vllm_version"] == ["0.11.0", "0.12.0"]
