"""An engine with /metrics only (vLLM's official image, no recorder installed) is first class:
its scrape series is stored, served by /api/v1/engines and the sidecar's /metrics, held in a
snapshot with its resolution, and the missing recorder is named with its fix."""

from __future__ import annotations

import asyncio
import time

from fastapi.testclient import TestClient

from collector.api.app import create_app
from collector.context import RECORDER_FIX
from collector.model import HALF_STATS, Event, EventKind, MetricsScrape, StepRecord
from collector.snapshot.freeze import freeze
from tests.api.api_context import make_context


def _scrapes(engine: str, t0: float, n: int) -> list[MetricsScrape]:
    return [
        MetricsScrape(
            engine=engine, ts=t0 + i, values={"num_requests_running": 3.0 + i % 2, "num_requests_waiting": 1.0, "kv_cache_usage_perc": 0.032}
        )
        for i in range(n)
    ]


def test_a_scrape_only_engine_is_stored_served_and_snapshotted(migrated_url: str) -> None:
    ctx = make_context(migrated_url, scrape_interval=1.0)
    t0 = time.time() - 400.0
    for s in _scrapes("decode-0", t0, 400):
        ctx.hub.emit(s)
    asyncio.run(ctx.writer.flush())
    stored = ctx.repo.recent_scrapes("decode-0", since=0)
    assert len(stored) == 400 and stored[-1]["values"]["kv_cache_usage_perc"] == 0.032

    [live] = [e for e in ctx.engines_live() if e["name"] == "decode-0"]
    assert live["configured"] and live["steps_received"] == 0 and live["running"] is None  # no recorder: no step figure
    assert live["last_scrape"]["values"]["num_requests_running"] in (3.0, 4.0)

    with TestClient(create_app(ctx)) as client:
        text = client.get("/metrics").text
        assert 'flightrec_engine_series_source{Hostname="node-a",engine="decode-0",source="scrape"} 1.0' in text
        assert 'flightrec_engine_kv_cache_usage_ratio{Hostname="node-a",engine="decode-0"} 0.032' in text
        [api] = [e for e in client.get("/api/v1/engines").json()["items"] if e["name"] == "decode-0"]
        assert api["last_scrape"] is not None

    trigger = Event(kind=EventKind.ENGINE_DOWN, ts=t0 + 400, source="scrape", message="gone", engine="decode-0")
    doc = freeze(ctx.view, "decode-0", trigger, scrape_interval=1.0)
    assert doc.steps == [] and "the scrape series is all there is" in doc.summary["no_recorder"]
    ts = [s["ts"] for s in doc.scrapes]
    assert len(ts) == 300 and min(ts) >= trigger.ts - 300.0  # the last five minutes, one a second
    assert doc.summary["scrape_interval_s"] == 1.0 and doc.summary["configured"] is True


def test_the_missing_recorder_is_named_with_its_fix_after_a_minute(migrated_url: str) -> None:
    ctx = make_context(migrated_url)
    for s in _scrapes("decode-0", time.time() - 5, 5):
        ctx.hub.emit(s)
    assert ctx.health()["recorder_missing"] == {}  # too early to say
    ctx.started_at -= 120.0
    h = ctx.health()
    assert h["recorder_missing"] == {"decode-0": RECORDER_FIX} and h["status"] == "degraded"
    assert [e["recorder"] for e in ctx.engines_live() if e["name"] == "decode-0"] == ["missing"]

    # a recorder writes, but under a name the sidecar could not join (a URL it cannot see)
    ctx.hub.emit(StepRecord(engine="vllm-4242", ts=time.time(), step=1, running=1, halves=HALF_STATS))
    fix = ctx.health()["recorder_missing"]["decode-0"]
    assert "vllm-4242" in fix and "FLIGHTREC_ENGINE_NAME=decode-0" in fix


def test_an_idle_engine_whose_recorder_is_joined_is_not_said_to_lack_one(migrated_url: str) -> None:
    """Seen on a GPU: an engine that had served no request yet (no step) was reported without a
    recorder although its rings were joined (their fingerprint had arrived)."""
    from collector.model import Fingerprint

    ctx = make_context(migrated_url)
    for s in _scrapes("decode-0", time.time() - 5, 5):
        ctx.hub.emit(s)
    ctx.hub.emit(Fingerprint(engine="decode-0", ts=time.time(), facts={"pid": 10, "server_pid": 10, "vllm_version": "0.26.0"}))
    ctx.started_at -= 120.0
    assert ctx.health()["recorder_missing"] == {}
    assert [e["recorder"] for e in ctx.engines_live() if e["name"] == "decode-0"] == ["recording"]
