"""The split placement through the real sidecar: per-step series stay in the node-local store,
the shared store gets the snapshot, the events, the engine's facts and the coarse series, and
nothing of the per-step series."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy import text

from collector.model import Event, EventKind, Severity, StepRecord
from collector.service import Service
from collector.settings import EngineConfig, load_settings
from collector.storage.connect import make_engine


def count(url: str, sql: str) -> int:
    db = make_engine(url)
    try:
        with db.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        db.dispose()


def test_steps_stay_local_and_the_fleet_share_reaches_the_shared_store(tmp_path: Path, database_url: str) -> None:
    local = f"sqlite:///{tmp_path / 'node.db'}"
    settings = load_settings(
        engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")],
        database={"local": local, "shared": database_url},
        host_name="node-a",
        nvml="off",
        kmsg="off",
        port=0,
        recorder_dir=tmp_path / "rec",
        spool_dir=tmp_path / "spool",
        write_batch_interval=0.1,
        fleet_series_interval_s=1.0,
        snapshot_settle_s=0.2,
    )
    svc = Service(settings)
    t0 = time.time() - 6.0  # steps in closed intervals already

    async def scenario() -> None:
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        assert svc.ctx is not None
        hub = svc.ctx.hub
        assert svc.rows is not None
        svc.rows.offer_fingerprint("decode-0", {"vllm_version": "0.11.0", "model": "m"})  # as ingest offers it
        for i in range(300):
            hub.emit(StepRecord(engine="decode-0", ts=t0 + i * 0.01, step=i, running=4, kv_cache_usage=0.25, generation_tokens=4))
        hub.emit(
            Event(kind=EventKind.ENGINE_DEAD, ts=time.time(), source="log", engine="decode-0", message="EngineDeadError", severity=Severity.CRITICAL)
        )
        for _ in range(150):
            if (
                svc.ctx.committer.committed
                and count(database_url, "SELECT COUNT(*) FROM engine_series")
                and count(local, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") == 300
            ):
                break
            await asyncio.sleep(0.1)
        svc.request_stop()
        await task

    asyncio.run(scenario())
    assert count(local, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") == 300
    assert count(database_url, "SELECT COALESCE(SUM(steps), 0) FROM engine_step_chunks") == 0  # per-step series never reach the shared store
    assert count(database_url, "SELECT COUNT(*) FROM snapshots WHERE host = 'node-a'") == 1
    assert count(database_url, "SELECT COUNT(*) FROM events WHERE kind = 'engine_dead'") == 1
    assert count(local, "SELECT COUNT(*) FROM events") == 0
    # 300 steps over 3 s in 1-s intervals: every step counted once, the averages as sent
    assert count(database_url, "SELECT SUM(steps) FROM engine_series") == 300
    assert count(database_url, "SELECT COUNT(*) FROM engine_series WHERE running_sum = 4 * running_samples AND kv_cache_usage_max = 0.25") >= 3
    assert count(database_url, "SELECT SUM(generation_tokens) FROM engine_series") == 1200
    assert count(database_url, "SELECT COUNT(*) FROM engines WHERE host = 'node-a' AND vllm_version = '0.11.0'") == 1
    assert count(local, "SELECT COUNT(*) FROM outbox") == 0  # all shipped


def test_db_upgrade_migrates_both_stores_of_a_node(tmp_path: Path) -> None:
    from collector.cli import main
    from collector.storage.migrate import current

    local, shared = f"sqlite:///{tmp_path / 'node.db'}", f"sqlite:///{tmp_path / 'shared.db'}"
    cfg = tmp_path / "flightrec.yaml"
    cfg.write_text(f"database:\n  local: {local}\n  shared: {shared}\n")
    assert main(["db", "upgrade", "--config", str(cfg)]) == 0
    assert current(local) == current(shared) is not None
