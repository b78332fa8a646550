"""The shared store stopped, then hung (SIGSTOP), then the sidecar stopped and started again
while it was still down, under a steady load: the node-local store keeps every step throughout,
the shared store's share waits in the outbox and is shipped when the store is back, and nothing
is lost or stored twice (every step counted once in the coarse series, one snapshot for the
fault, one row per event). A throwaway Postgres cluster of its own (scripts/outage.py's): the
shared server is never stopped."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from collector.model import Event, EventKind, Severity, StepRecord
from collector.service import Service
from collector.settings import EngineConfig, load_settings
from collector.storage.connect import make_engine

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import outage  # noqa: E402

RATE = 100  # steps/s


def scalar(url: str, sql: str) -> Any:
    db = make_engine(url)
    try:
        with db.connect() as conn:
            return conn.execute(text(sql)).scalar_one()
    finally:
        db.dispose()


class Load:
    """Steps at RATE/s into the sidecar's hub, numbered across restarts."""

    def __init__(self) -> None:
        self.sent = 0

    async def run(self, svc: Service, seconds: float) -> None:
        assert svc.ctx is not None
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            svc.ctx.hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=self.sent, running=2, generation_tokens=1))
            self.sent += 1
            await asyncio.sleep(1 / RATE)


@pytest.mark.slow
def test_shared_store_down_hung_and_a_restart_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    if outage.pg_bin("initdb") is None or outage.pg_bin("pg_ctl") is None:
        pytest.skip("initdb/pg_ctl not installed (scripts/install-test-deps.sh installs postgresql)")
    pg_dir = Path(tempfile.mkdtemp(prefix="flightrec-shared-"))  # pytest's folders are root-only; the cluster runs as postgres
    cluster = outage.Cluster(pg_dir)
    local = f"sqlite:///{tmp_path / 'node.db'}"
    settings = load_settings(
        engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")],
        database={"local": local, "shared": cluster.url},
        host_name="node-a",
        nvml="off",
        kmsg="off",
        port=0,
        recorder_dir=tmp_path / "rec",
        spool_dir=tmp_path / "spool",
        write_batch_interval=0.2,
        fleet_series_interval_s=1.0,
        snapshot_settle_s=0.2,
    )
    load = Load()
    figures: dict[str, Any] = {}

    async def first_run() -> None:
        svc = Service(settings)
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        assert svc.ctx is not None
        await load.run(svc, 2.0)
        cluster.stop()  # down
        await load.run(svc, 2.0)
        svc.ctx.hub.emit(
            Event(kind=EventKind.ENGINE_DEAD, ts=time.time(), source="log", engine="decode-0", message="EngineDeadError", severity=Severity.CRITICAL)
        )
        before = scalar(local, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks")
        await load.run(svc, 3.0)
        figures["local_grew_while_down"] = scalar(local, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") - before
        figures["outbox_while_down"] = scalar(local, "SELECT COUNT(*) FROM outbox")
        figures["health_down"] = svc.ctx.health()
        cluster.start()
        await load.run(svc, 2.0)
        stopped = cluster.hang()  # hung: statements wait, connections time out
        await load.run(svc, 4.0)
        figures["local_grew_while_hung"] = scalar(local, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") - before
        cluster.resume(stopped)
        await load.run(svc, 2.0)
        cluster.stop()  # and down again, then the sidecar stops with the outbox full
        await load.run(svc, 2.0)
        svc.request_stop()
        await task
        figures["outbox_at_stop"] = scalar(local, "SELECT COUNT(*) FROM outbox")

    async def second_run() -> None:
        cluster.start()
        svc = Service(settings)
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        await load.run(svc, 2.0)
        for _ in range(200):  # the outbox shipped, the spooled snapshots committed
            if scalar(local, "SELECT COUNT(*) FROM outbox") == 0 and not list((tmp_path / "spool").glob("*.spool")):
                break
            await asyncio.sleep(0.1)
        svc.request_stop()
        await task

    try:
        asyncio.run(first_run())
        asyncio.run(second_run())
        shared = cluster.url
        assert figures["local_grew_while_down"] > RATE  # the node-local store kept writing
        assert figures["local_grew_while_hung"] > 3 * RATE
        assert figures["outbox_while_down"] > 0 and figures["outbox_at_stop"] > 0  # held on the node's disk
        down = figures["health_down"]  # /healthz says so while the node-local store is fine
        assert down["status"] == "degraded" and down["shared_store"]["shared_up"] is False and down["shared_store"]["outbox_batches"] > 0
        assert down["shared_store"]["shared_error"]
        assert scalar(local, "SELECT COUNT(*) FROM outbox") == 0  # then all shipped
        assert scalar(local, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") == load.sent  # no step lost on the node
        # every step counted once in the shared store's coarse series: none lost, none twice
        assert scalar(shared, "SELECT SUM(steps) FROM engine_series") == load.sent
        assert scalar(shared, "SELECT SUM(generation_tokens) FROM engine_series") == load.sent
        # the snapshots taken while the store was down (the engine's URL answers nothing, and the
        # fault) were spooled, then committed once each
        assert not list((tmp_path / "spool").glob("*.spool"))
        assert scalar(shared, "SELECT COUNT(*) FROM snapshots") >= 1
        assert scalar(shared, "SELECT COUNT(*) - COUNT(DISTINCT (host, engine, trigger_uid)) FROM snapshots") == 0
        assert scalar(shared, "SELECT COUNT(*) FROM events WHERE kind = 'engine_dead'") == 1
        assert scalar(shared, "SELECT COUNT(*) - COUNT(DISTINCT (host, uid)) FROM events") == 0
        assert scalar(shared, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") == 0
    finally:
        cluster.destroy()
        shutil.rmtree(pg_dir, ignore_errors=True)
