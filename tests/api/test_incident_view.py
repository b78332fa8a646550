"""GET /api/v1/incidents/{id}/view: one incident whole, across engines and hosts."""

from __future__ import annotations

import sys
from pathlib import Path

from fastapi.testclient import TestClient

from collector.api.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))
from api_context import make_context  # noqa: E402
from scale_db import build  # noqa: E402


def test_the_view_joins_every_snapshot_of_the_incident(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'scale.db'}"
    ids = build(url, first_steps=20, other_steps=5)
    client = TestClient(create_app(make_context(url, host_name="node-a")))
    view = client.get("/api/v1/incidents/1/view").json()
    assert [s["id"] for s in view["snapshots"]] == ids and view["hosts"] == ["node-a", "node-b"]
    assert len(view["engines"]) == 8 and all(e["snapshots"] for e in view["engines"])
    assert view["pairs"] == {"pd-a": ["node-a/decode-0", "node-a/prefill-0"], "pd-b": ["node-b/decode-0", "node-b/prefill-0"]}
    roles = {(e["host"], e["engine"]): e["role"] for e in view["engines"]}
    assert roles[("node-a", "decode-0")] == "kv_consumer" and roles[("node-b", "prefill-0")] == "kv_producer"
    # one timeline: a host's Xid, held by the four snapshots of that host, appears once with all four
    xids = [e for e in view["timeline"] if e["kind"] == "xid"]
    assert len(xids) == 2 and sorted(len(e["snapshots"]) for e in xids) == [4, 4]
    # the pod and container the kubelet gave the faulty GPU to
    assert xids[0]["gpu_holders"] == [
        {"namespace": "inference", "pod": "decode-0", "container": "vllm", "device": "GPU-4a1b7c2d-0e3f-5a6b-7c8d-9e0f1a2b3c4d"}
    ]
    assert all(e["gpu_holders"] == [] for e in view["timeline"] if e["kind"] != "xid")
    assert [e["ts"] for e in view["timeline"]] == sorted(e["ts"] for e in view["timeline"])
    assert {e["engine"] for e in view["timeline"] if e["kind"] == "cuda_error"} == {"decode-0", "prefill-0", "engine-2", "engine-3"}
    names = {a["alertname"] for a in view["alerts"]}
    assert {"GpuXidError", "VllmEngineCrashed"} <= names
    assert view["snapshots"][0]["url"].endswith("/snapshots/1")
    assert client.get("/api/v1/incidents/99/view").status_code == 404
    # the page itself is a shell, served without a token
    page = client.get("/incidents/1")
    assert page.status_code == 200 and "/ui/incident.js" in page.text
