"""Tables. Times are unix seconds (double precision) everywhere: cheap to write, and a Grafana
SQL panel turns them into timestamps with ``to_timestamp(ts)``.

Continuous series (``engine_step_chunks``, ``engine_scrapes``, ``gpu_samples``, ``events``) are
written in batches and pruned by retention. Steps are stored a chunk of seconds per row
(``storage/stepchunks.py``); ``engine_steps`` holds steps stored one per row before 0005, read
beside the chunks until retention has pruned them. A snapshot is one ``snapshots`` row (the summary every list shows) and a
few ``snapshot_parts`` rows, each a gzip JSON document (steps, per-request rows, GPU samples,
events, log lines): a 4096-step x 64-request snapshot is 262k request rows, which would take
seconds to insert row by row on Postgres but is a few compressed blobs in one transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JsonType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments INTEGER PRIMARY KEY, so big ids are BIGINT on Postgres only.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class EngineRow(Base):
    __tablename__ = "engines"
    __table_args__ = (UniqueConstraint("host", "name", name="uq_engines_host_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(128))
    url: Mapped[str | None] = mapped_column(String(1024))
    pair: Mapped[str | None] = mapped_column(String(128))
    vllm_version: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(32), default="unknown")
    first_seen: Mapped[float] = mapped_column(Double)
    last_seen: Mapped[float] = mapped_column(Double)
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JsonType)


class GpuRow(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("host", "gpu", name="uq_gpus_host_gpu"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    gpu: Mapped[str] = mapped_column(String(128))  # UUID, or gpu<index>
    index: Mapped[int] = mapped_column(Integer)
    bus_id: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    first_seen: Mapped[float] = mapped_column(Double)
    last_seen: Mapped[float] = mapped_column(Double)


class EngineStepRow(Base):
    """One engine step, both halves merged, as stored before 0005 (steps are written as chunks
    now: ``EngineStepChunkRow``); read beside the chunks until retention prunes them. A figure no
    half carried is NULL (unknown), never 0. ``run`` is the engine's API-server pid: step
    numbers restart when the engine does."""

    __tablename__ = "engine_steps"
    __table_args__ = (
        Index("ix_engine_steps_engine_ts", "engine_id", "ts"),
        UniqueConstraint("engine_id", "run", "step", name="uq_engine_steps_engine_run_step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Double)
    step: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    running: Mapped[int | None] = mapped_column(Integer)
    waiting: Mapped[int | None] = mapped_column(Integer)
    kv_cache_usage: Mapped[float | None] = mapped_column(Double)
    preemptions: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    generation_tokens: Mapped[int | None] = mapped_column(Integer)
    mirror_rows: Mapped[int | None] = mapped_column(Integer)
    host_blocks: Mapped[int | None] = mapped_column(Integer)


class EngineStepChunkRow(Base):
    """One engine's steps of one run within a few seconds (``stepchunks.CHUNK_S``), their
    columns packed in ``payload`` (``encoding``: ``stepchunks.ENCODING``). A step is in at most
    one chunk: the writer leaves out steps already stored, found through ``ix_..._last_step``,
    and the unique key holds a chunk written twice to one row. Readers find chunks by time
    (``ix_..._ts``: ``ts_max`` from a reader's ``since``); retention deletes whole chunks."""

    __tablename__ = "engine_step_chunks"
    __table_args__ = (
        UniqueConstraint("engine_id", "run", "first_step", name="uq_engine_step_chunks_first_step"),
        Index("ix_engine_step_chunks_last_step", "engine_id", "run", "last_step"),
        Index("ix_engine_step_chunks_ts", "engine_id", "ts_max"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id", ondelete="CASCADE"))
    run: Mapped[int] = mapped_column(BigInteger)
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    ts_min: Mapped[float] = mapped_column(Double)
    ts_max: Mapped[float] = mapped_column(Double)
    steps: Mapped[int] = mapped_column(Integer)
    encoding: Mapped[str] = mapped_column(String(32))
    payload: Mapped[bytes] = mapped_column(LargeBinary)


class EngineStepSecondRow(Base):
    """An engine's steps per second, in SQL (dashboards, and kept longer than the chunks:
    ``retention.step_seconds_hours``): ``ts`` the second's start, ``steps`` how many steps,
    ``running``/``waiting``/``kv_cache_usage``/``mirror_rows``/``host_blocks`` their maxima,
    ``preemptions``/``prompt_tokens``/``generation_tokens`` their sums (NULL: no step carried
    the figure). A second whose steps came in two writes is two rows: a reader adds them up."""

    __tablename__ = "engine_step_seconds"
    __table_args__ = (Index("ix_engine_step_seconds_engine_ts", "engine_id", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Double)
    steps: Mapped[int] = mapped_column(Integer)
    running: Mapped[int | None] = mapped_column(Integer)
    waiting: Mapped[int | None] = mapped_column(Integer)
    kv_cache_usage: Mapped[float | None] = mapped_column(Double)
    preemptions: Mapped[int | None] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    generation_tokens: Mapped[int | None] = mapped_column(BigInteger)
    mirror_rows: Mapped[int | None] = mapped_column(Integer)
    host_blocks: Mapped[int | None] = mapped_column(Integer)


class EngineScrapeRow(Base):
    """One /metrics scrape of an engine: the series of engines without a recorder (vLLM's
    official image), and the cross-check of those with one."""

    __tablename__ = "engine_scrapes"
    __table_args__ = (Index("ix_engine_scrapes_engine_ts", "engine_id", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Double)
    running: Mapped[float | None] = mapped_column(Double)
    waiting: Mapped[float | None] = mapped_column(Double)
    kv_cache_usage: Mapped[float | None] = mapped_column(Double)
    # Every figure kept from the scrape: packed (``storage/scrapepack.py``, since 0005), or as
    # JSON in ``values`` (rows stored before 0005). The one set, the other NULL.
    values: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    packed: Mapped[bytes | None] = mapped_column(LargeBinary)


class GpuSampleRow(Base):
    __tablename__ = "gpu_samples"
    __table_args__ = (Index("ix_gpu_samples_gpu_ts", "gpu_id", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Double)
    memory_used: Mapped[int | None] = mapped_column(BigInteger)
    memory_total: Mapped[int | None] = mapped_column(BigInteger)
    utilization: Mapped[float | None] = mapped_column(Double)
    temperature: Mapped[float | None] = mapped_column(Double)
    power_w: Mapped[float | None] = mapped_column(Double)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Double)
    clock_event_reasons: Mapped[int | None] = mapped_column(BigInteger)
    ecc_volatile_uncorrected: Mapped[int | None] = mapped_column(BigInteger)
    remapped_rows_uncorrectable: Mapped[int | None] = mapped_column(Integer)
    pcie_replay: Mapped[int | None] = mapped_column(BigInteger)


class IncidentRow(Base):
    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_opened", "opened_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(255))
    title: Mapped[str] = mapped_column(Text)
    opened_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    trigger_kind: Mapped[str] = mapped_column(String(32))
    hosts: Mapped[list[str]] = mapped_column(JsonType, default=list)
    engines: Mapped[list[str]] = mapped_column(JsonType, default=list)
    snapshot_count: Mapped[int] = mapped_column(Integer, default=0)


class SnapshotRow(Base):
    __tablename__ = "snapshots"
    __table_args__ = (
        Index("ix_snapshots_created", "created_at"),
        Index("ix_snapshots_engine", "engine"),
        Index("ix_snapshots_trigger", "trigger_kind"),
        # one snapshot per trigger and engine: a trigger retaken after a restart (its intent
        # survived a kill after the commit) finds the snapshot it already has
        Index("uq_snapshots_trigger_uid", "host", "engine", "trigger_uid", unique=True),
        # the fleet view's groups and filters (collector/fleet/queries.py)
        Index("ix_snapshots_signature", "signature", "fault_ts"),
        Index("ix_snapshots_host_fault", "host", "fault_ts"),
        Index("ix_snapshots_xid", "xid"),
        Index("ix_snapshots_model", "model"),
        Index("ix_snapshots_vllm_version", "vllm_version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    host: Mapped[str] = mapped_column(String(255))
    engine: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Double)
    fault_ts: Mapped[float] = mapped_column(Double)
    trigger_kind: Mapped[str] = mapped_column(String(32))
    trigger_source: Mapped[str] = mapped_column(String(32))
    trigger_message: Mapped[str] = mapped_column(Text)
    trigger_uid: Mapped[str | None] = mapped_column(String(40))  # the trigger event's id (NULL before 0003)
    step_count: Mapped[int] = mapped_column(Integer)
    request_rows: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int | None] = mapped_column(BigInteger)
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    summary: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    # The crash signature (collector/fleet/signature.py) and the facts the fleet view filters
    # on, as columns (NULL: unknown, or a snapshot stored before 0004).
    signature: Mapped[str | None] = mapped_column(String(32))
    fault_class: Mapped[str | None] = mapped_column(String(16))  # hardware | software | unknown
    gpu: Mapped[str | None] = mapped_column(String(128))
    xid: Mapped[int | None] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(255))
    vllm_version: Mapped[str | None] = mapped_column(String(64))


class SnapshotPartRow(Base):
    __tablename__ = "snapshot_parts"

    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id", ondelete="CASCADE"), primary_key=True)
    part: Mapped[str] = mapped_column(String(32), primary_key=True)
    encoding: Mapped[str] = mapped_column(String(16))  # "json+gzip"
    payload: Mapped[bytes] = mapped_column(LargeBinary)


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_ts", "ts"),
        Index("ix_events_kind_ts", "kind", "ts"),
        Index("ix_events_engine_ts", "engine", "ts"),
        Index("ix_events_uid", "uid"),
        # an event is one row: the writer's insert and a retaken trigger's insert never both land
        # (with ts: on Postgres events are partitioned by ts, and a unique key must hold it)
        Index("uq_events_host_uid", "host", "uid", "ts", unique=True),
        Index("ix_events_host_ts", "host", "ts"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    uid: Mapped[str | None] = mapped_column(String(40))  # given at ingest; links snapshots and alerts
    ts: Mapped[float] = mapped_column(Double)
    host: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    engine: Mapped[str | None] = mapped_column(String(128))
    gpu: Mapped[str | None] = mapped_column(String(128))
    xid: Mapped[int | None] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer)
    process: Mapped[str | None] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("snapshots.id", ondelete="SET NULL"), nullable=True)


class EngineSeriesRow(Base):
    """The coarse engine series the shared store keeps: one row per engine per interval
    (``fleet_series_interval_s``, 10 s), made on the node from its steps (collector/fleet/coarse.py).
    Keyed by names, not ids, so a node writes it without a lookup; on Postgres partitioned by ts."""

    __tablename__ = "engine_series"

    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    engine: Mapped[str] = mapped_column(String(128), primary_key=True)
    ts: Mapped[float] = mapped_column(Double, primary_key=True)  # the interval's start
    part: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the writer's row id: shipped twice, stored once
    span_s: Mapped[float] = mapped_column(Double)
    steps: Mapped[int] = mapped_column(Integer)
    running_sum: Mapped[float | None] = mapped_column(Double)
    running_samples: Mapped[int] = mapped_column(Integer)
    running_max: Mapped[int | None] = mapped_column(Integer)
    waiting_max: Mapped[int | None] = mapped_column(Integer)
    kv_cache_usage_sum: Mapped[float | None] = mapped_column(Double)
    kv_cache_usage_samples: Mapped[int] = mapped_column(Integer)
    kv_cache_usage_max: Mapped[float | None] = mapped_column(Double)
    preemptions: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    generation_tokens: Mapped[int | None] = mapped_column(BigInteger)
    mirror_rows_max: Mapped[int | None] = mapped_column(Integer)


class GpuSeriesRow(Base):
    """The coarse GPU series of the shared store: one row per GPU per interval."""

    __tablename__ = "gpu_series"

    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu: Mapped[str] = mapped_column(String(128), primary_key=True)
    ts: Mapped[float] = mapped_column(Double, primary_key=True)
    part: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    span_s: Mapped[float] = mapped_column(Double)
    samples: Mapped[int] = mapped_column(Integer)
    utilization_sum: Mapped[float | None] = mapped_column(Double)
    utilization_samples: Mapped[int] = mapped_column(Integer)
    memory_used_max: Mapped[int | None] = mapped_column(BigInteger)
    temperature_max: Mapped[float | None] = mapped_column(Double)
    power_w_sum: Mapped[float | None] = mapped_column(Double)
    power_w_samples: Mapped[int] = mapped_column(Integer)
    sm_clock_mhz_min: Mapped[float | None] = mapped_column(Double)
    clock_event_reasons: Mapped[int | None] = mapped_column(BigInteger)  # OR of the interval's
    ecc_volatile_uncorrected_max: Mapped[int | None] = mapped_column(BigInteger)
    remapped_rows_uncorrectable_max: Mapped[int | None] = mapped_column(Integer)
    pcie_replay_max: Mapped[int | None] = mapped_column(BigInteger)


class OutboxRow(Base):
    """The node's rows bound for the shared store, kept in the node-local store until the shared
    store has them (collector/fleet/outbox.py): a shared store that is down or slow costs disk
    on the node, never a row. Only the node-local store uses it."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Double)
    payload: Mapped[str] = mapped_column(Text)  # JSON
