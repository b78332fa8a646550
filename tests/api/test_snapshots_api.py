"""The REST API over a real database (SQLite, and Postgres when marked): snapshot list filters
and cursor pagination, one snapshot, the export, the checklist, bad parameters, body limits,
token rules, redaction and incidents."""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

import pytest
from api_context import make_context
from fastapi.testclient import TestClient

from collector.api.app import create_app
from collector.api.schemas import SnapshotDocOut
from collector.model import Event, EventKind, GpuSample, LogLine, Severity, StepRecord
from collector.snapshot.document import SCHEMA, SnapshotDoc
from collector.snapshot.freeze import build_snapshot
from collector.storage.repo import Repository
from tests.request_columns import Row, with_rows

PG_SECRET = "postgresql+psycopg://flight:hunter2-pw@db.internal:5432/flightrec"
HF_SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def make_doc(
    engine: str = "decode-0",
    *,
    host: str = "node-a",
    ts: float | None = None,
    steps: int = 20,
    reqs: int = 4,
    kind: EventKind = EventKind.XID,
    pair: str | None = None,
    fingerprint: dict[str, Any] | None = None,
) -> SnapshotDoc:
    ts = time.time() if ts is None else ts
    recs = [
        with_rows(
            StepRecord(engine=engine, ts=ts - steps + i, step=1000 + i, running=reqs, waiting=1, kv_cache_usage=0.032),
            [Row(f"req-{j}", 32000, 32000 + i, i, mirror_rows=400 + i) for j in range(reqs)],
        )
        for i in range(steps)
    ]
    trigger = Event(kind=kind, ts=ts, source="kmsg", message="NVRM: Xid (PCI:0000:00:06): 43", xid=43, severity=Severity.CRITICAL)
    failure = Event(
        kind=EventKind.CUDA_ERROR,
        ts=ts + 0.4,
        source="log",
        engine=engine,
        process="Worker_TP0",
        message=f"CUDA error: unspecified launch failure (db {PG_SECRET})",
        lines=[
            "Traceback (most recent call last):",
            f"  connecting to {PG_SECRET}",
            "torch.AcceleratorError: CUDA error: unspecified launch failure",
        ],
    )
    fp = (
        fingerprint
        if fingerprint is not None
        else {
            "vllm_version": "0.11.1",
            "block_size": 64,
            "env": {"HF_TOKEN": HF_SECRET, "NCCL_NET_PLUGIN": "none"},
        }
    )
    return build_snapshot(
        host=host,
        engine=engine,
        trigger=trigger,
        steps=recs,
        gpu_samples=[GpuSample(gpu="GPU-1", index=1, ts=ts - 1, utilization=90.0)],
        events=[trigger, failure],
        log_lines=[LogLine(engine, ts, f"DATABASE_URL={PG_SECRET} token={HF_SECRET}")],
        fingerprint=fp,
        extra_summary={"pair": pair} if pair else None,
        created_at=ts,
    )


def store(repo: Repository, doc: SnapshotDoc, window: float = 30.0) -> tuple[int, int]:
    return repo.store_snapshot(doc, incident_window_s=window, incident_key="k")


def test_one_snapshot_round_trips_with_its_parts(client: TestClient, ctx: Any) -> None:
    sid, iid = store(ctx.repo, make_doc())
    r = client.get(f"/api/v1/snapshots/{sid}")
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    doc = r.json()
    SnapshotDocOut.model_validate(doc)
    assert (doc["schema"], doc["id"], doc["incident_id"], doc["engine"]) == (SCHEMA, sid, iid, "decode-0")
    cols = doc["requests"]["columns"]
    assert len(cols["step"]) == 20 * 4 and cols["request_id"][:4] == ["req-0", "req-1", "req-2", "req-3"]
    assert {len(v) for v in cols.values()} == {80}
    assert [s["step"] for s in doc["steps"]] == list(range(1000, 1020))
    assert doc["summary"]["failed_processes"]["Worker_TP0"]["step"] == 1019
    # a client that does not take gzip gets the same JSON, uncompressed
    plain = client.get(f"/api/v1/snapshots/{sid}", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and json.loads(plain.content) == doc


def test_export_is_one_gzip_file_of_the_documented_schema(client: TestClient, ctx: Any) -> None:
    sid, _ = store(ctx.repo, make_doc())
    r = client.get(f"/api/v1/snapshots/{sid}/export", headers={"Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    assert r.headers["content-disposition"] == f'attachment; filename="flightrec-snapshot-{sid}.json.gz"'
    data = json.loads(gzip.decompress(r.content))  # one gzip member, CRC and length checked
    assert list(data) == [
        "schema",
        "id",
        "incident_id",
        "host",
        "engine",
        "created_at",
        "fault_ts",
        "trigger",
        "summary",
        "fingerprint",
        "steps",
        "requests",
        "gpu_samples",
        "events",
        "log_lines",
        "peers",
        "workload",
        "scrapes",
    ]
    assert data["workload"] is None  # recorded by no workload log: null, not an empty list
    SnapshotDocOut.model_validate(data)
    again = SnapshotDoc.from_export(data)  # the export reads back into the document it came from
    assert len(again.requests) == 80 and again.requests[-1]["mirror_rows"] == 419


def test_secrets_never_leave_in_a_snapshot(client: TestClient, ctx: Any) -> None:
    sid, _ = store(ctx.repo, make_doc())
    for path in (f"/api/v1/snapshots/{sid}", "/api/v1/snapshots", f"/api/v1/snapshots/{sid}/checklist"):
        body = client.get(path, headers={"Accept-Encoding": "identity"}).text
        assert "hunter2-pw" not in body and HF_SECRET not in body, path
    doc = client.get(f"/api/v1/snapshots/{sid}").json()
    assert doc["fingerprint"]["env"]["HF_TOKEN"] == "***"
    assert "flight:***@db.internal" in doc["log_lines"][0]["line"]


def test_engines_are_served_without_secrets_even_as_an_older_sidecar_stored_them(client: TestClient, ctx: Any) -> None:
    # a row written before redaction reached the engines table (or by another sidecar)
    ctx.repo.update_engine(
        "decode-0",
        fingerprint={"env": {"HF_TOKEN": HF_SECRET}, "db": "postgresql://flight:hunter2-pw@db/x", "argv": ["--api-key", "sk-live-abcdef"]},
        vllm_version="0.32.0",
    )
    body = client.get("/api/v1/engines", headers={"Accept-Encoding": "identity"}).text
    for secret in (HF_SECRET, "hunter2-pw", "sk-live-abcdef"):
        assert secret not in body, secret
    [eng] = [e for e in client.get("/api/v1/engines").json()["items"] if e["name"] == "decode-0"]
    assert eng["fingerprint"]["env"]["HF_TOKEN"] == "***" and eng["vllm_version"] == "0.32.0"


def test_list_filters_by_engine_host_trigger_and_time(client: TestClient, ctx: Any, api_url: str) -> None:
    t = 1_800_000_000.0
    other = Repository(ctx.repo.db, host="node-b")
    a = store(ctx.repo, make_doc("decode-0", ts=t), window=1)[0]
    b = store(ctx.repo, make_doc("prefill-0", ts=t + 10, kind=EventKind.CUDA_ERROR), window=1)[0]
    c = store(other, make_doc("decode-0", host="node-b", ts=t + 20), window=1)[0]

    def ids(**params: Any) -> list[int]:
        r = client.get("/api/v1/snapshots", params=params)
        assert r.status_code == 200, r.text
        return [s["id"] for s in r.json()["items"]]

    assert ids() == [c, b, a]
    assert ids(engine="decode-0") == [c, a]
    assert ids(host="node-b") == [c]
    assert ids(trigger="cuda_error") == [b]
    assert ids(since=t + 5, until=t + 20) == [b]
    assert ids(engine="nope") == []
    item = client.get("/api/v1/snapshots", params={"engine": "prefill-0"}).json()["items"][0]
    assert item["url"].endswith(f"/snapshots/{b}") and item["trigger_kind"] == "cuda_error"


def test_cursor_pages_have_no_duplicates_and_no_gaps(client: TestClient, ctx: Any) -> None:
    t = 1_800_000_000.0
    stored = []
    for i in range(23):  # pairs of snapshots share a created_at: the id breaks the tie
        stored.append(store(ctx.repo, make_doc(ts=t + i // 2, steps=2, reqs=1), window=0.1)[0])
    seen: list[int] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 5}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/api/v1/snapshots", params=params).json()
        seen += [s["id"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(stored, reverse=True)


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/snapshots/999999", 404),
        ("/api/v1/snapshots/999999/export", 404),
        ("/api/v1/snapshots/999999/checklist", 404),
        ("/api/v1/incidents/999999", 404),
        ("/api/v1/snapshots/0", 422),
        ("/api/v1/snapshots/abc", 422),
        ("/api/v1/snapshots?limit=0", 422),
        ("/api/v1/snapshots?limit=100000", 422),
        ("/api/v1/snapshots?trigger=not-a-kind", 422),
        ("/api/v1/snapshots?since=nan", 422),
        ("/api/v1/snapshots?since=-5", 422),
        ("/api/v1/snapshots?since=10&until=5", 400),
        ("/api/v1/snapshots?cursor=%21%21garbage", 400),
        ("/api/v1/events?kind=bogus", 422),
        ("/api/v1/events?since=10&until=10", 400),
    ],
)
def test_bad_parameters_get_4xx_with_a_message(client: TestClient, path: str, status: int) -> None:
    r = client.get(path)
    assert r.status_code == status, r.text
    assert r.json()["detail"]


def write_client(url: str, **settings: Any) -> tuple[TestClient, Any]:
    ctx = make_context(url, **settings)
    return TestClient(create_app(ctx)), ctx


def test_writes_need_the_token_compared_in_full(api_url: str) -> None:
    c, ctx = write_client(api_url)
    assert c.post("/api/v1/snapshots", json={}).status_code == 403  # no token configured: no writes
    c, ctx = write_client(api_url, api_token="tok-123")
    assert c.post("/api/v1/snapshots", json={}).status_code == 401
    assert c.post("/api/v1/snapshots", json={}, headers={"Authorization": "Bearer tok-12"}).status_code == 401
    assert c.post("/api/v1/snapshots", json={}, headers={"Authorization": "Basic tok-123"}).status_code == 401
    r = c.post("/api/v1/snapshots", json={"engine": "decode-0", "reason": "drill"}, headers={"Authorization": "Bearer tok-123"})
    # the committer is not running here: the snapshot is captured, answered 202 as pending
    assert r.status_code == 202 and r.json()["engines"] == ["decode-0"], r.text
    assert [s["status"] for s in r.json()["snapshots"]] == ["pending"]
    assert ctx.committer.backlog == 1 and ctx.committer.ledger.current("decode-0").trigger.message  # type: ignore[union-attr] == "drill"
    assert c.get("/api/v1/snapshots").status_code == 200  # loopback: reads are open


def test_reads_need_the_token_when_bound_beyond_loopback(api_url: str) -> None:
    c, _ = write_client(api_url, host="0.0.0.0", api_token="tok-123")  # noqa: S104
    for path in ("/api/v1/snapshots", "/api/v1/incidents", "/api/v1/events", "/api/v1/engines", "/api/v1/gpus", "/metrics"):
        assert c.get(path).status_code == 401, path
        assert c.get(path, headers={"Authorization": "Bearer tok-123"}).status_code == 200, path
    # the page shells hold no data; their data calls carry the token
    assert c.get("/snapshots/1").status_code == 404  # no such snapshot; the shell itself needs no token


@pytest.mark.parametrize("body", [{"engine": "x" * 200}, {"reason": "r", "extra": 1}, {"engine": "no-such-engine"}])
def test_bad_manual_requests_are_refused(api_url: str, body: dict[str, Any]) -> None:
    c, _ = write_client(api_url, api_token="t")
    r = c.post("/api/v1/snapshots", json=body, headers={"Authorization": "Bearer t"})
    assert r.status_code in (404, 422) and r.json()["detail"]


def test_oversized_bodies_get_413_declared_or_streamed(api_url: str) -> None:
    c, _ = write_client(api_url, api_token="t")
    big = json.dumps({"reason": "x" * 100_000})
    r = c.post("/api/v1/snapshots", content=big, headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
    assert r.status_code == 413

    def chunks() -> Any:
        for _ in range(100):
            yield b"x" * 1024

    r = c.post("/api/v1/snapshots", content=chunks(), headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
    assert r.status_code == 413


def test_checklist_reads_the_pair_peer_fingerprint(client: TestClient, ctx: Any) -> None:
    ctx.repo.register_engine("prefill-0", url="http://p", pair="pd-0")
    ctx.repo.update_engine("prefill-0", fingerprint={"env": {"NCCL_NET_PLUGIN": "none", "HF_TOKEN": HF_SECRET}, "role": "prefill"})
    sid, _ = store(ctx.repo, make_doc(pair="pd-0"))
    items = {i["key"]: i for i in client.get(f"/api/v1/snapshots/{sid}/checklist").json()["items"]}
    assert items["nccl_net_plugin"]["value"] == {"decode-0": "none", "prefill-0": "none"}
    assert items["block_size"]["value"] == 64 and items["xid"]["value"] == [43]
    assert items["cuda_graph_mode"] == {
        "key": "cuda_graph_mode",
        "label": "CUDA graph mode",
        "recorded": False,
        "status": "not_recorded",
        "value": None,
        "text": "not recorded",
        "detail": None,
    }
    peers = client.get(f"/api/v1/snapshots/{sid}").json()["peers"]
    assert peers[0]["engine"] == "prefill-0" and peers[0]["fingerprint"]["env"]["HF_TOKEN"] == "***"


def test_incidents_group_the_pair_and_hosts_sharing_a_database(client: TestClient, ctx: Any) -> None:
    t = 1_800_000_000.0
    b = Repository(ctx.repo.db, host="node-b")
    d, i1 = store(ctx.repo, make_doc("decode-0", ts=t, pair="pd-0"))
    p, i2 = store(ctx.repo, make_doc("prefill-0", ts=t + 1.5, pair="pd-0"))
    o, i3 = store(b, make_doc("decode-0", host="node-b", ts=t + 3))
    late, i4 = store(ctx.repo, make_doc("decode-0", ts=t + 3600))
    assert i1 == i2 == i3 != i4
    inc = client.get(f"/api/v1/incidents/{i1}").json()
    assert inc["hosts"] == ["node-a", "node-b"] and inc["snapshot_count"] == 3
    assert inc["engines"] == ["node-a/decode-0", "node-a/prefill-0", "node-b/decode-0"]
    assert [s["id"] for s in inc["snapshots"]] == [d, p, o]
    assert [i["id"] for i in client.get("/api/v1/incidents").json()["items"]] == [i4, i1]
    # a snapshot committed late (spooled while the database was down) joins its fault's incident
    _, i5 = store(ctx.repo, make_doc("decode-1", ts=t + 2))
    assert i5 == i1


def test_a_replay_link_is_served_at_once_even_when_the_export_was_cached(api_url: str) -> None:
    c, ctx = write_client(api_url, api_token="tok-123")
    auth = {"Authorization": "Bearer tok-123"}
    snap_id, _ = store(ctx.repo, make_doc(ts=time.time() - 3600))  # settled: its export is cached
    assert c.get(f"/api/v1/snapshots/{snap_id}").json()["summary"].get("replays") is None
    link = {
        "snapshot_id": snap_id + 1,
        "ts": time.time(),
        "target": "http://vllm:8000",
        "speed": 1.0,
        "died": True,
        "died_phase": 5,
        "died_concurrency": 16,
        "done_before_death": 10,
    }
    assert c.post(f"/api/v1/snapshots/{snap_id}/replays", json=link).status_code == 401
    r = c.post(f"/api/v1/snapshots/{snap_id}/replays", json=link, headers=auth)
    assert r.status_code == 201 and r.json()["replays"] == [link], r.text
    assert c.get(f"/api/v1/snapshots/{snap_id}").json()["summary"]["replays"] == [link]
    assert c.post(f"/api/v1/snapshots/{snap_id + 99}/replays", json=link, headers=auth).status_code == 404
    assert c.post(f"/api/v1/snapshots/{snap_id}/replays", json={**link, "extra": 1}, headers=auth).status_code == 422
    # an amendment after the link keeps it
    ctx.repo.amend_snapshot(snap_id, make_doc(ts=time.time() - 3600))
    assert ctx.repo.get_snapshot(snap_id, parts=()).summary["replays"] == [link]
