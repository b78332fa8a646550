"""Retention: rows older than their kind's horizon go; events a snapshot holds stay with it. Steps
go a whole chunk at a time (``steps.StepStore.prune``): a step stays at most one chunk's span
(``stepchunks.CHUNK_S``) past its horizon."""

from __future__ import annotations

from sqlalchemy import delete, select

from collector.storage.database import Database
from collector.storage.models import EngineScrapeRow, EventRow, GpuSampleRow, SnapshotPartRow, SnapshotRow
from collector.storage.steps import StepStore


def prune(
    d: Database,
    steps: StepStore,
    *,
    steps_before: float,
    gpu_before: float,
    events_before: float,
    snapshots_before: float | None,
    step_seconds_before: float | None = None,
) -> dict[str, int]:
    """One pass; returns what went per table (``engine_steps``: steps at full resolution,
    chunks and old rows alike; ``engine_step_seconds``: per-second rows, before
    ``step_seconds_before``, by default ``steps_before``)."""
    counts = {}
    with d.tx() as conn:
        counts["engine_steps"] = steps.prune(conn, before=steps_before)  # steps, not rows
        counts["engine_step_seconds"] = steps.prune_seconds(conn, before=steps_before if step_seconds_before is None else step_seconds_before)
        counts["engine_scrapes"] = conn.execute(delete(EngineScrapeRow).where(EngineScrapeRow.ts < steps_before)).rowcount
        counts["gpu_samples"] = conn.execute(delete(GpuSampleRow).where(GpuSampleRow.ts < gpu_before)).rowcount
        counts["events"] = conn.execute(delete(EventRow).where(EventRow.ts < events_before, EventRow.snapshot_id.is_(None))).rowcount
        if snapshots_before is not None:
            old = select(SnapshotRow.id).where(SnapshotRow.created_at < snapshots_before)
            conn.execute(delete(SnapshotPartRow).where(SnapshotPartRow.snapshot_id.in_(old)))
            counts["snapshots"] = conn.execute(delete(SnapshotRow).where(SnapshotRow.created_at < snapshots_before)).rowcount
    return counts
