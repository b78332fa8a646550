"""The incident's triage checklist, answered from one snapshot: run the demo (the simulated P/D
pair that dies as the report describes), take the decode engine's snapshot and check every
item against what the simulated incident is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from collector.api.app import create_app
from collector.sim.engine import VERSION
from collector.sim.scenario import Scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from api_context import make_context  # noqa: E402

pytestmark = pytest.mark.slow
SC = Scenario()


@pytest.fixture(scope="module")
def snapshot(demo_run: Any) -> dict[str, Any]:
    db = demo_run.db
    client = TestClient(create_app(make_context(db)))
    items = client.get("/api/v1/snapshots", params={"engine": "decode-0"}).json()["items"]
    assert len(items) == 1, items
    sid = items[0]["id"]
    doc = client.get(f"/api/v1/snapshots/{sid}").json()
    checklist = client.get(f"/api/v1/snapshots/{sid}/checklist").json()
    return {"doc": doc, "items": {i["key"]: i for i in checklist["items"]}}


def item(snapshot: dict[str, Any], key: str) -> Any:
    it = snapshot["items"][key]
    assert it["recorded"], f"{key}: not recorded"
    return it["value"]


def test_deployment_facts(snapshot: dict[str, Any]) -> None:
    assert item(snapshot, "vllm_version") == VERSION
    assert item(snapshot, "connectors") == ["MultiConnector", "NixlConnector", "HiSparseConnector"]
    detail = snapshot["items"]["connectors"]["detail"]
    assert detail["kv_connector_extra_config"]["connectors"][1]["kv_connector_extra_config"]["host_pool_gib"] == SC.host_pool_gib
    assert item(snapshot, "host_pool_size") in (SC.host_pool_gib, f"{SC.host_pool_gib:g} GiB")
    imports = snapshot["items"]["import_prefix_via_host"]  # vLLM has no such setting: grey, not red
    assert not imports["recorded"] and imports["status"] == "not_exposed" and imports["text"] == "not exposed by this vLLM"
    assert item(snapshot, "block_size") == SC.block_size
    assert item(snapshot, "nccl_net_plugin") == {"decode-0": "none", "prefill-0": "none"}  # both engines of the pair
    assert item(snapshot, "cuda_launch_blocking") == "0"
    assert item(snapshot, "cuda_graph_mode") == "FULL"


def test_engine_state_at_the_crash(snapshot: dict[str, Any]) -> None:
    doc = snapshot["doc"]
    last = doc["steps"][-1]
    cols = doc["requests"]["columns"]
    at_last = [i for i, s in enumerate(cols["step"]) if s == last["step"]]
    # the last step before the death came in both halves: its figures are known, not nulls
    assert last["has_stats"] and last["has_requests"] and last["requests"] == len(at_last)
    assert doc["summary"]["at_step"]["running"] == doc["summary"]["at_step"]["kv_cache_usage"] == last["step"]
    assert item(snapshot, "load_concurrency") == SC.phases[SC.crash_phase].concurrency  # the C16 phase
    assert item(snapshot, "running") == last["running"] == len(at_last) > 0
    ctx = item(snapshot, "context_lengths")
    lengths = [cols["computed_tokens"][i] for i in at_last]
    assert ctx == {"min": min(lengths), "mean": round(sum(lengths) / len(lengths)), "max": max(lengths)}
    assert SC.isl < ctx["min"] and ctx["max"] < SC.isl + SC.osl  # long prompts, mid-way through their outputs
    kv = item(snapshot, "kv_cache_usage")
    assert kv == last["kv_cache_usage"] and kv == pytest.approx(0.032, abs=0.003)
    assert item(snapshot, "preemptions") == 0
    # host-mirror rows: a summary (total, distribution, the requests with the most), not a map of every id
    rows = {cols["request_id"][i]: cols["mirror_rows"][i] for i in at_last}
    mirror = item(snapshot, "mirror_rows")
    assert mirror["total"] == sum(rows.values()) and mirror["requests"] == len(rows) and mirror["min"] > 0
    assert mirror["max"] == max(rows.values()) and mirror["min"] == min(rows.values())
    most = snapshot["items"]["mirror_rows"]["detail"]
    assert 0 < len(most) <= 5 and all(rows[rid] == n for rid, n in most.items()) and max(most.values()) == mirror["max"]


def test_the_fault(snapshot: dict[str, Any]) -> None:
    doc = snapshot["doc"]
    failed = item(snapshot, "failed_workers")
    workers = {p: s for p, s in failed.items() if p.startswith("Worker_")}
    assert sorted(workers) == sorted(SC.failing_workers)
    assert len(set(workers.values())) == 1  # the two TP workers fail at the same step
    assert workers["Worker_TP0"] == doc["steps"][-1]["step"]
    assert item(snapshot, "xid") == [SC.xid]
    assert snapshot["items"]["xid"]["text"] == f"{SC.xid} (GPU stopped processing: application)"  # the code and its class
    # the Xid as the first source saw it: NVML's event ("Xid 43 ...") or the kernel's line
    # ("NVRM: Xid (PCI:...): 43, ..."), whichever came first on a loaded machine
    fault = snapshot["items"]["fault"]["text"]
    assert fault.startswith("xid: Xid 43") or (fault.startswith("xid: NVRM: Xid (PCI:") and "): 43," in fault), fault
    keys = list(snapshot["items"])
    assert keys.index("xid") < keys.index("connectors") < keys.index("vllm_version")  # the fault's questions first
    # whole tracebacks, frames included, for both workers
    tbs = {e["process"]: e for e in doc["events"] if e["kind"] == "cuda_error" and e.get("frames")}
    assert {"Worker_TP0", "Worker_TP1"} <= set(tbs)
    assert any("hisparse/worker.py" in f["file"] for f in tbs["Worker_TP0"]["frames"])
    assert any("async_utils.py" in f["file"] for f in tbs["Worker_TP1"]["frames"])
