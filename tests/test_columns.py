"""Steps as columns (collector.columns): unknown stays None through a batch, and a batch offered
to the writer is stored as rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from collector.columns import INT_NULL, STEP_COLUMNS, batch_from_rows
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter


def test_unknown_is_none_through_a_batch() -> None:
    rows = [
        {"ts": 10.0, "step": 1, "run": 7, "running": 3, "kv_cache_usage": 0.5},
        {"ts": 10.1, "step": 2, "run": 7, "waiting": 0},
    ]
    batch = batch_from_rows("decode-0", rows)
    assert batch.cols["running"][1] == INT_NULL
    got = [dict(zip(STEP_COLUMNS, t, strict=True)) for t in batch.tuples()]
    assert got[0]["running"] == 3 and got[0]["waiting"] is None and got[0]["kv_cache_usage"] == 0.5
    assert got[1]["running"] is None and got[1]["waiting"] == 0 and got[1]["kv_cache_usage"] is None


def test_writer_stores_a_batch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    upgrade(url)
    repo = Repository(make_engine(url), host="node-a")
    writer = BatchWriter(repo, interval=0.1, hold_s=0.0)
    writer.offer_steps(batch_from_rows("decode-0", [{"ts": 100.0 + i, "step": i, "run": 1, "running": i} for i in range(5)]))
    assert writer.pending_rows == 5
    asyncio.run(writer.flush(everything=True))
    assert writer.steps_written == 5
    stored = repo.recent_steps("decode-0", since=0.0)
    assert [s["running"] for s in stored] == [0, 1, 2, 3, 4]
    assert stored[0]["waiting"] is None
