"""Response and request models (they are the OpenAPI contract)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = Field(description="ok, or degraded when the database or a source is failing")
    version: str
    database_up: bool | None
    sources: list[dict[str, Any]]
    tasks: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the sidecar's own tasks: name, up, restarts, last_error, since (epoch s of the last start or failure), done",
    )
    snapshots_committed: int
    snapshots_waiting: int = Field(0, description="captured snapshots not committed yet (database down)")
    database_error: str | None = None
    spool_error: str | None = Field(None, description="why snapshots cannot be spooled (disk full): held in memory")
    ingest: dict[str, Any] = Field(default_factory=dict, description="records received, written, lost, lag")
    behind: bool = Field(False, description="the sidecar itself is late (its loop or its ring reads)")
    recorder_missing: dict[str, str] = Field(default_factory=dict, description="engine -> how to add its recorder")
    shared_store: dict[str, Any] | None = Field(
        None,
        description="with a node-local and a shared store (docs/fleet.md): shared_up, shared_error, outbox_batches waiting, "
        "batches and rows shipped, ship p50/p99; null with one store",
    )


class EngineOut(BaseModel):
    name: str
    host: str
    url: str | None = None
    pair: str | None = None
    up: bool | None = None
    state: str | None = Field(
        None,
        description="the engine's verdict: ok, idle, sleeping, paused, starting, wedged, down or gpu_fault "
        "(null: an engine another sidecar stored, not watched here)",
    )
    state_since: float | None = Field(None, description="when it entered that state, unix s (a wedge: its last step)")
    state_reason: str | None = None
    last_seen: float | None = None
    steps_in_ring: int = 0
    last_step: int | None = None
    run: int | None = Field(None, description="the engine's current run: its recorder's run id (a restart begins a new one)")
    previous_run: dict[str, Any] | None = Field(
        None,
        description="the run before the current one, kept apart (run, ended_at, steps_in_ring, first_step, last_step); "
        "null when none; its steps are in the snapshots of its own faults, never mixed with the current run's",
    )
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None
    vllm_version: str | None = None
    fingerprint: dict[str, Any] | None = None
    configured: bool | None = Field(None, description="false: steps of an engine no engines: entry names")
    steps_received: int | None = None
    request_rows_received: int | None = None
    last_scrape: dict[str, Any] | None = None
    recorder: str | None = Field(None, description="recording, none, or missing (serves /metrics, no recorder)")
    recorder_fix: str | None = None


class EngineHealth(BaseModel):
    engine: str
    state: str = Field(description="ok, idle, sleeping, paused, starting (200); wedged, down, gpu_fault (503)")
    since: float | None = Field(None, description="when it entered that state, unix s")
    reason: str = ""


class DetectorOut(BaseModel):
    name: str
    state: str
    reason: str = ""
    suggested_action: str = ""
    value: float | None = None
    ts: float | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class GpuOut(BaseModel):
    gpu: str
    host: str
    index: int
    bus_id: str | None = None
    name: str | None = None
    last_sample: dict[str, Any] | None = None


class SnapshotSummary(BaseModel):
    id: int
    incident_id: int | None
    host: str
    engine: str
    created_at: float
    fault_ts: float
    trigger_kind: str
    trigger_source: str
    trigger_message: str
    step_count: int
    request_rows: int
    first_step: int | None
    last_step: int | None
    summary: dict[str, Any]
    url: str = Field(description="the snapshot's page")


class SnapshotList(BaseModel):
    items: list[SnapshotSummary]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class RequestColumns(BaseModel):
    columns: dict[str, list[Any]] = Field(
        description="one list per field (step, request_id, prompt_len, computed_tokens, output_tokens, "
        "preemptions, status, mirror_rows[, extras]); row i is {name: columns[name][i]}"
    )
    sparse: list[str] = Field(description="columns left out of a row where their value is null")


class Peer(BaseModel):
    host: str
    engine: str
    pair: str | None = None
    role: str | None = None
    fingerprint: dict[str, Any]


class SnapshotDocOut(BaseModel):
    """A snapshot, as the export schema flightrec.snapshot/v1 describes it."""

    schema_: str = Field(alias="schema")
    id: int
    incident_id: int | None
    host: str
    engine: str
    created_at: float
    fault_ts: float
    trigger: dict[str, Any]
    summary: dict[str, Any]
    fingerprint: dict[str, Any]
    steps: list[dict[str, Any]]
    requests: RequestColumns
    gpu_samples: list[dict[str, Any]]
    events: list[dict[str, Any]]
    log_lines: list[dict[str, Any]]
    peers: list[Peer] = Field(default_factory=list, description="the other engines of the pair, with their fingerprints")
    workload: dict[str, Any] | None = Field(default=None, description="the requests before the fault, for replay; null when not recorded")
    stacks: dict[str, Any] | None = Field(
        default=None,
        description="a wedge's snapshot only (trigger engine_wedged): every engine process's stacks read twice, schema "
        "flightrec.stacks/v1 (processes[].blocking.frame is the blocking frame); absent from any other snapshot",
    )

    model_config = {"populate_by_name": True}


class ManualSnapshotIn(BaseModel):
    engine: str | None = Field(default=None, max_length=128, description="one engine, or all when absent")
    reason: str = Field(default="manual snapshot", max_length=1000)

    model_config = {"extra": "forbid"}


class ReplayLinkIn(BaseModel):
    """A replay's outcome, linked from the snapshot it replayed (``summary.replays``)."""

    snapshot_id: int | None = Field(default=None, ge=0, le=2**63 - 1, description="the replay's own snapshot")
    ts: float | None = Field(default=None, description="when the replay began, unix seconds")
    target: str | None = Field(default=None, max_length=2048)
    speed: float | None = Field(default=None, gt=0, le=1e6)
    died: bool
    died_phase: int | None = Field(default=None, ge=1, le=1_000_000)
    died_concurrency: int | None = Field(default=None, ge=0, le=1_000_000)
    done_before_death: int | None = Field(default=None, ge=0, le=2**31)

    model_config = {"extra": "forbid"}


class ManualSnapshotOut(BaseModel):
    engines: list[str]
    status: str = Field("committed", description="committed, or accepted while the database is down")
    ids: list[int] = Field(default_factory=list)
    snapshots: list[dict[str, Any]] = Field(default_factory=list, description="per engine: id, status, error")


class IncidentOut(BaseModel):
    id: int
    key: str
    title: str
    opened_at: float
    updated_at: float
    trigger_kind: str
    hosts: list[str]
    engines: list[str]
    snapshot_count: int
    snapshots: list[SnapshotSummary] | None = None


class EventOut(BaseModel):
    id: int
    ts: float
    host: str
    kind: str
    source: str
    severity: str
    engine: str | None
    gpu: str | None
    xid: int | None
    pid: int | None
    process: str | None
    message: str
    data: dict[str, Any]
    snapshot_id: int | None


class IncidentList(BaseModel):
    items: list[IncidentOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class EventList(BaseModel):
    items: list[EventOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class ChecklistItem(BaseModel):
    key: str
    label: str
    recorded: bool = Field(description="false when the snapshot cannot answer the question")
    status: str = Field("recorded", description="recorded, not_recorded (the snapshot cannot answer), or not_exposed (no vLLM release exposes it)")
    value: Any = None
    text: str = Field(description="the value as the page shows it, or 'not recorded'")
    detail: Any = None


class Checklist(BaseModel):
    snapshot_id: int
    engine: str
    host: str
    peers: list[str | None]
    items: list[ChecklistItem]


class IncidentView(BaseModel):
    """One incident whole, for its page: the engines and hosts involved (P/D peers too), one
    timeline of every witness across them, its snapshots, replays and the alerts its events page."""

    id: int
    title: str
    key: str
    opened_at: float
    updated_at: float
    trigger_kind: str
    first_fault_ts: float | None
    hosts: list[str]
    engines: list[dict[str, Any]] = Field(description="host, engine, pair, role (kv_producer/kv_consumer), vllm_version, snapshots (ids)")
    pairs: dict[str, list[str]] = Field(description="P/D pair name -> host/engine of its engines")
    timeline: list[dict[str, Any]] = Field(description="every event of every snapshot, once, oldest first, with the snapshots holding it")
    snapshots: list[dict[str, Any]]
    replays: list[dict[str, Any]] = Field(description="replays linked from the snapshots (summary.replays), with of_snapshot")
    alerts: list[dict[str, Any]] = Field(description="the alerts these events page with (alertname, severity, labels, starts_at)")


class EngineList(BaseModel):
    items: list[EngineOut]
    next_cursor: str | None = Field(default=None, description="always null: the live engines are one page")


class GpuList(BaseModel):
    items: list[GpuOut]
    next_cursor: str | None = Field(default=None, description="always null: the live GPUs are one page")


class DetectorList(BaseModel):
    items: list[DetectorOut]
    next_cursor: str | None = Field(default=None, description="always null: the detectors are one page")


class StepsBefore(BaseModel):
    snapshot_id: int
    engine: str
    fault_ts: float
    since: float = Field(description="the first bin's start (unix seconds)")
    bin_s: float = Field(description="seconds per bin")
    columns: dict[str, list[Any]] = Field(
        description="one list per field, row i is bin i: t (its start), steps, running, waiting, kv_cache_usage (maxima), "
        "prompt_tokens, generation_tokens, preemptions (sums); null where no step carried the figure"
    )
