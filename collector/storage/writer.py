"""The batching writer: every ``interval`` it takes what the hub queued and writes it in one
transaction (SQLite: ~300k rows/s batched vs ~10k one commit per row). A database that is down
costs nothing but memory: the batch goes back to the hub (bounded, oldest dropped and counted)
and is retried next round."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from collector.ingest.hub import Hub, PendingWrites
from collector.storage.db import StorageError
from collector.storage.repo import Repository

log = logging.getLogger(__name__)


def _step_row(rec: Any) -> dict[str, Any]:
    return {
        "engine": rec.engine, "ts": rec.ts, "step": rec.step, "running": rec.running,
        "waiting": rec.waiting, "kv_cache_usage": float(rec.kv_cache_usage),
        "preemptions": rec.preemptions, "prompt_tokens": rec.prompt_tokens,
        "generation_tokens": rec.generation_tokens, "mirror_rows": rec.mirror_rows,
    }  # fmt: skip


def _gpu_row(s: Any) -> dict[str, Any]:
    return {
        "gpu": s.gpu, "index": s.index, "bus_id": s.bus_id, "name": s.name, "ts": s.ts,
        "memory_used": s.memory_used, "memory_total": s.memory_total, "utilization": s.utilization,
        "temperature": s.temperature, "power_w": s.power_w, "sm_clock_mhz": s.sm_clock_mhz,
        "clock_event_reasons": s.clock_event_reasons,
        "ecc_volatile_uncorrected": s.ecc_volatile_uncorrected,
        "remapped_rows_uncorrectable": s.remapped_rows_uncorrectable, "pcie_replay": s.pcie_replay,
    }  # fmt: skip


def event_row(ev: Any) -> dict[str, Any]:
    from collector.redact import redact

    data = dict(ev.data)
    if ev.frames:
        data["frames"] = ev.frames
    if ev.lines:
        data["lines"] = ev.lines[-200:]
    data["sources"] = ev.sources
    return {
        "ts": ev.ts, "kind": ev.kind.value, "source": ev.source, "severity": ev.severity.value,
        "engine": ev.engine, "gpu": ev.gpu, "xid": ev.xid, "pid": ev.pid, "process": ev.process,
        "message": redact(ev.message)[:8000], "data": redact(data),
        "snapshot_id": ev.data.get("snapshot_id"),
    }  # fmt: skip


class BatchWriter:
    def __init__(self, hub: Hub, repo: Repository, *, interval: float) -> None:
        self.hub = hub
        self.repo = repo
        self.interval = interval
        self.db_up: bool | None = None
        self.last_error = ""
        self.rows_written = 0
        self.flushes = 0
        self.last_flush_s = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        batch = self.hub.take_pending()
        if not (batch.steps or batch.gpu or batch.events or batch.fingerprints or batch.seen):
            return
        t0 = time.perf_counter()
        try:
            await asyncio.to_thread(self._write, batch)
        except StorageError as exc:
            if self.db_up is not False:
                log.error("database write failed, holding %d rows in memory: %s", len(batch.steps), exc)
            self.db_up, self.last_error = False, str(exc)
            self.hub.requeue(batch)
            return
        if self.db_up is False:
            log.warning("database is back; wrote the rows held meanwhile")
        self.db_up, self.last_error = True, ""
        self.flushes += 1
        self.last_flush_s = time.perf_counter() - t0

    def _write(self, batch: PendingWrites) -> None:
        steps = [_step_row(r) for r in batch.steps.values()]
        gpu = [_gpu_row(s) for s in batch.gpu]
        events = [event_row(e) for e in batch.events]
        self.repo.write_batch(steps, gpu, events, batch.seen)
        for name, facts in batch.fingerprints.items():
            self.repo.update_engine(name, fingerprint=facts, vllm_version=str(facts.get("vllm_version") or "") or None)
        self.rows_written += len(steps) + len(gpu) + len(events)
