"""Whole outputs against golden files: the sidecar's own /metrics (its flightrec_* families) and a
snapshot export, from fixed inputs. A change to either is a change to a contract (dashboards,
rules and scripts read them): regenerate with FLIGHTREC_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from collector.api.metrics import SidecarCollector, commit_latency_histogram
from collector.context import AppContext
from collector.detectors.task import DetectorTask
from collector.ingest.hub import Hub
from collector.model import HALF_STATS, Event, EventKind, GpuSample, MetricsScrape, Severity, StepRecord
from collector.settings import EngineConfig, Settings
from collector.snapshot.freeze import freeze
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter
from tests.request_columns import Row, with_rows
from tests.wiring import with_committer

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
T0 = 1_796_000_000.0


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FLIGHTREC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with FLIGHTREC_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file (FLIGHTREC_UPDATE_GOLDEN=1 to accept)"


def _hub(tmp_path: Path) -> tuple[Hub, AppContext]:
    settings = Settings(
        engines=[
            EngineConfig(name="decode-0", url="http://127.0.0.1:8000", pair="pd-0"),
            EngineConfig(name="prefill-0", url="http://127.0.0.1:8001", pair="pd-0"),
        ],
        host_name="node-a",
        ring_steps=16,
        database=f"sqlite:///{tmp_path / 'g.db'}",
    )
    repo = Repository(make_engine(settings.database), host="node-a")
    writer = BatchWriter(repo, interval=1.0)
    hub, committer = with_committer(settings, repo, rows=writer, clock=lambda: T0 + 10, spool_dir=tmp_path / "spool", settle_s=1.0, window_s=30.0)
    ctx = AppContext(
        settings=settings,
        hub=hub,
        repo=repo,
        writer=writer,
        committer=committer,
        detectors=DetectorTask(hub.view, hub.emit, settings.detectors),
        loop=asyncio.new_event_loop(),
    )
    for i in range(4):
        hub.emit(
            StepRecord(
                engine="decode-0",
                ts=T0 + i,
                step=100 + i,
                running=2,
                waiting=1,
                kv_cache_usage=0.032,
                preemptions=0,
                prompt_tokens=0,
                generation_tokens=2,
                finished=0,
                halves=HALF_STATS,
                connector={"HiSparseConnector.pending_page_transfers": 3},
            )
        )
        hub.emit(
            with_rows(
                StepRecord(engine="decode-0", ts=T0 + i, step=100 + i),
                [
                    Row("cmpl-aaaa-0", 32000, 32000 + i, i, 0, "running", 1, 500 + i),
                    Row("cmpl-bbbb-0", 32000, 31000 + i, i, 0, "running", 1, 480 + i),
                ],
            )
        )
    hub.emit(
        with_rows(StepRecord(engine="decode-0", ts=T0 + 4, step=104), [Row("cmpl-aaaa-0", 32000, 32004, 4, 0, "running", 1, 504)])
    )  # the scheduler's half only
    hub.emit(
        MetricsScrape(engine="prefill-0", ts=T0 + 2, values={"num_requests_running": 1.0, "num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.25})
    )
    hub.emit(
        GpuSample(
            gpu="GPU-0000",
            index=0,
            ts=T0 + 3,
            bus_id="0000:00:06.0",
            name="NVIDIA H200",
            temperature=41.0,
            power_w=120.5,
            utilization=0.87,
            memory_used=1 << 30,
            memory_total=141 << 30,
        )
    )
    return hub, ctx


def test_the_sidecars_own_metrics_match_their_golden_file(tmp_path: Path) -> None:
    _, ctx = _hub(tmp_path)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(ctx, commit_latency=commit_latency_histogram()))  # not the process-wide one
    text = generate_latest(registry).decode()
    _check("sidecar-metrics.txt", text)


def test_a_snapshot_export_matches_its_golden_file(tmp_path: Path) -> None:
    hub, _ = _hub(tmp_path)
    xid = Event(
        kind=EventKind.XID,
        ts=T0 + 4.5,
        source="kmsg",
        severity=Severity.CRITICAL,
        gpu="0000:00:06.0",
        xid=43,
        pid=3107,
        message="NVRM: Xid (PCI:0000:00:06): 43, pid=3107, name=python3, channel 0x0000000a",
        uid="golden-xid",
    )
    hub.emit(xid)
    doc = freeze(hub.view, "decode-0", xid, gpu_seconds=60)
    doc.created_at = T0 + 5
    export: dict[str, Any] = json.loads(json.dumps(doc.to_export(), default=str))
    _check("snapshot-export.json", json.dumps(export, indent=1, sort_keys=True) + "\n")
