"""Internal: Domain records that flow from the sources to the hub, the rings, storage and the API.

Plain dataclasses with no I/O: every source turns what it reads into these, and nothing
downstream knows which source produced a record except through its ``source`` field.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple, Protocol


class EventKind(str, enum.Enum):
    """What an event says happened. Stored as its value; stable names for the API."""

    XID = "xid"  # a GPU Xid error (kernel log and/or NVML event)
    GPU_LOST = "gpu_lost"  # NVML says the GPU fell off the bus (NVMLError_GpuIsLost)
    CUDA_ERROR = "cuda_error"  # a CUDA error line or traceback in an engine log
    NCCL_ERROR = "nccl_error"
    ENGINE_FATAL = "engine_fatal"  # "EngineCore encountered a fatal error"
    ENGINE_DEAD = "engine_dead"  # EngineDeadError, or a "died unexpectedly" line
    ENGINE_DOWN = "engine_down"  # /health or /metrics failing K scrapes in a row
    ENGINE_WEDGED = "engine_wedged"  # requests held, no step for far longer than the engine's own pace
    ENGINE_RESUMED = "engine_resumed"  # a wedged engine stepped again (the wedge's end and its length)
    RECORDER_SILENT = "recorder_silent"  # the in-engine channel stopped with the process gone
    CRASH_DUMP = "crash_dump"  # vLLM's own "Dumping scheduler output/stats" lines
    ANOMALY = "anomaly"  # a detector's state change
    MANUAL = "manual"  # POST /api/v1/snapshots
    LOG = "log"  # any other matched log line worth keeping


# Events after which the engine is dead: the requests in flight failed with it (a snapshot's
# workload says so; the committer expects no more steps from the engine).
CRASH_KINDS = frozenset(
    {
        EventKind.XID,
        EventKind.GPU_LOST,
        EventKind.CUDA_ERROR,
        EventKind.NCCL_ERROR,
        EventKind.ENGINE_FATAL,
        EventKind.ENGINE_DEAD,
        EventKind.RECORDER_SILENT,
    }
)
# Of those, the errors the engine reports itself: paged as the engine's crash (an Xid, a lost GPU
# and a silent recorder page under names of their own).
ENGINE_ERROR_KINDS = frozenset({EventKind.ENGINE_FATAL, EventKind.ENGINE_DEAD, EventKind.CUDA_ERROR})


class Severity(str, enum.Enum):
    """The one scale of how bad something is: an event's severity, a detector's state, an
    alert's ``severity`` label. ``OK`` is a detector's state when nothing is wrong (no event or
    alert carries it)."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.OK: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}


class StepRequests(Protocol):
    """One step's running requests as the recorder wrote them: the ``R`` record's bytes and the
    aggregates every stage reads (``collector.channel.blocks.RequestBlock`` is the one kind).
    Rows are decoded from it only when a snapshot is read, never one Python object per row."""

    @property
    def step(self) -> int: ...
    @property
    def ts(self) -> float: ...
    @property
    def n(self) -> int: ...  # rows
    @property
    def flags(self) -> int: ...  # which optional columns follow (the codec's FLAG_*)
    @property
    def cols(self) -> bytes: ...  # the columns, in wire order

    # the ids, UTF-8, NUL-joined; ingest points equal ids at one copy (the same bytes)
    ids: bytes

    @property
    def running(self) -> int: ...  # rows whose status is running
    @property
    def mirror_rows(self) -> int | None: ...  # host-mirror rows this step, None when unknown
    @property
    def host_blocks(self) -> int | None: ...  # host blocks held, None when unknown
    @property
    def nbytes(self) -> int: ...  # what holding it costs, for the rings' byte bound

    def column(self, name: str) -> list[Any]:
        """One column (``collector.channel.blocks.COLUMNS``), decoded."""
        ...


# The fields of a step that come from the stat logger's half (SchedulerStats/IterationStats).
# A step whose stats half never arrived has them None: unknown, never 0.
STAT_FIELDS = (
    "running",
    "waiting",
    "kv_cache_usage",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "finished",
    "waiting_by_reason",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "connector",
    "engine_index",
    "worker",
    "finished_requests",
    "details",
)
# what vLLM reports of a step only when asked (``StepRecord.details``): its iteration details
# (--enable-logging-iteration-details), the CUDA graph it ran (--cudagraph-metrics: runtime_mode,
# padded and unpadded tokens) and the KV connector's external prefix-cache queries
STEP_DETAIL_KEYS = ("iteration", "cudagraph", "external_prefix_cache")
HALF_STATS = 1  # the stat logger's record of the step arrived
HALF_REQUESTS = 2  # the scheduler's per-request record arrived


@dataclass(slots=True)
class StepRecord:
    """One engine step as the in-engine recorder (or the simulator) reports it.

    Never changed once made (ingest's window builds new ones from its columns when asked), but
    not a frozen dataclass: a frozen one's ``__init__`` costs 5 us against 0.8 us (21 fields set
    through ``object.__setattr__``), and a snapshot builds up to 4,096 per engine at a fault.

    A step arrives in up to two halves from two processes: the stat logger's aggregates and
    the scheduler's per-request block. Every figure is None until a half that carries it
    arrives; ``halves`` says which did."""

    engine: str  # sidecar-side engine name (e.g. "decode-0")
    ts: float  # unix seconds
    step: int  # engine step counter
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None  # 0..1
    preemptions: int | None = None  # preemptions in this step
    prompt_tokens: int | None = None  # prompt tokens computed in this step
    generation_tokens: int | None = None  # tokens generated in this step
    finished: int | None = None  # requests finished in this step
    waiting_by_reason: dict[str, int] = field(default_factory=dict)
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    connector: dict[str, Any] = field(default_factory=dict)  # kv_connector_stats, by connector
    engine_index: int = 0  # vLLM's DP engine index
    worker: str | None = None  # process that reported it, when known
    # requests that finished in this step, with vLLM's per-request figures (request_id,
    # finish_reason, e2e_latency, num_prompt_tokens, num_generation_tokens, ...)
    finished_requests: list[dict[str, Any]] = field(default_factory=list)
    # the running requests as the recorder wrote them (the scheduler's half)
    request_block: StepRequests | None = field(default=None, repr=False, compare=False)
    # STEP_DETAIL_KEYS that this step carried, as the recorder wrote them
    details: dict[str, Any] = field(default_factory=dict)
    halves: int = field(default=0, compare=False)
    run: int = field(default=0, compare=False)  # the writing engine's server pid: step numbers restart with a new run

    def copy(self) -> StepRecord:
        """A shallow copy, what ``copy.copy`` makes in a fifth of its time (0.9 us against 4.5):
        the rings copy a held step each time one gives up its request block, ~800 a second at a
        node's load, rather than change a record a capture or the writer's queue may hold."""
        return StepRecord(*_step_fields(self))

    @property
    def mirror_rows(self) -> int | None:
        block = self.request_block
        if block is not None and block.mirror_rows is not None:
            return block.mirror_rows
        value = self.connector.get("mirror_rows")
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def host_blocks(self) -> int | None:
        block = self.request_block
        return None if block is None else block.host_blocks

    @property
    def request_count(self) -> int | None:
        block = self.request_block
        return None if block is None else block.n

    def to_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in ("engine", "ts", "step", *STAT_FIELDS)}
        out["mirror_rows"] = self.mirror_rows
        out["host_blocks"] = self.host_blocks
        return out


_step_fields = attrgetter(*(f.name for f in fields(StepRecord)))  # every field, in the constructor's order


@dataclass(frozen=True, slots=True)
class StepExtra:
    """What a stats half carried beyond the fixed figures (rare: an ``S`` record's JSON extras):
    its waiting split when not the plain one (None: rebuilt from ``waiting`` and ``deferred``),
    connector stats, worker and ``STEP_DETAIL_KEYS`` details."""

    waiting_by_reason: dict[str, int] | None = None
    connector: dict[str, Any] = field(default_factory=dict)
    worker: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepHalves:
    """One ring read's step halves of one engine run, as columns (``collector.channel.reads``):
    ``stats`` the stat logger's halves (a numpy array of ``collector.ingest.window.STATS_DTYPE``,
    or None), ``extras`` their rare extra figures by row, ``blocks`` the scheduler's request
    blocks, in the order read. Sidecar only (the engine-side recorder never builds one)."""

    engine: str
    run: int
    stats: Any = None
    extras: dict[int, StepExtra] = field(default_factory=dict)
    blocks: tuple[StepRequests, ...] = ()
    # each block's (step, ts) where a record put it elsewhere than the block says (records
    # made by tests and tools); empty: the blocks' own
    block_at: tuple[tuple[int, float], ...] = ()

    @property
    def count(self) -> int:
        """The halves it holds (records read)."""
        return (0 if self.stats is None else len(self.stats)) + len(self.blocks)


@dataclass(slots=True, frozen=True)
class GpuSample:
    """One NVML poll of one GPU. ``None`` means not supported or not read this time."""

    gpu: str  # GPU UUID when known, else "gpu<index>"
    index: int
    ts: float
    bus_id: str | None = None  # normalised PCI bus id, e.g. "0000:00:06.0"
    name: str | None = None
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    utilization: float | None = None  # percent
    memory_utilization: float | None = None
    temperature: float | None = None  # Celsius
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    clock_event_reasons: int | None = None  # bit mask (nvmlClocksEventReason*)
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    pcie_replay: int | None = None
    processes: list[dict[str, Any]] = field(default_factory=list)  # [{"pid":..,"used_memory":..}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Event:
    """Something that happened: a fault, a death, an anomaly, a manual request."""

    kind: EventKind
    ts: float
    source: str  # "kmsg", "nvml", "log", "scrape", "recorder", "api", "detector", "sim"
    message: str
    severity: Severity = Severity.WARNING
    engine: str | None = None  # sidecar engine name, when the event belongs to one
    gpu: str | None = None  # normalised bus id or UUID
    xid: int | None = None
    pid: int | None = None
    process: str | None = None  # vLLM process prefix, e.g. "Worker_TP1"
    frames: list[dict[str, Any]] = field(default_factory=list)  # traceback frames
    lines: list[str] = field(default_factory=list)  # raw log lines, traceback included
    data: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # every source that reported it (merged)
    uid: str = ""  # given once at ingest; snapshots, stored rows and alerts link by it

    def __post_init__(self) -> None:
        if not self.sources:
            self.sources = [self.source]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = self.kind.value
        out["severity"] = self.severity.value
        return out


# vLLM's counters whose change between two scrapes means the engine stepped (one observation of
# iteration_tokens per step; the tokens it computed): an engine's progress without the recorder
PROGRESS_COUNTERS = ("iteration_tokens_total_count", "prompt_tokens_total", "generation_tokens_total")


@dataclass(slots=True, frozen=True)
class MetricsScrape:
    """Values kept from one /metrics scrape of one engine (vLLM families, by engine label)."""

    engine: str
    ts: float
    values: dict[str, float]  # e.g. {"num_requests_running": 3.0, "kv_cache_usage_perc": 0.1}
    rates: dict[str, float] = field(default_factory=dict)  # per-second rates of counters
    model_name: str | None = None
    # "scrape" for /metrics; "log" for the engine log's 10 s stat line (a fallback series)
    origin: str = "scrape"
    # vLLM's GET /is_paused, asked only while the engine holds requests and its counters stood
    # still since the previous scrape (None: not asked, or no such endpoint)
    paused: bool | None = None


@dataclass(slots=True, frozen=True)
class Fingerprint:
    """Deployment facts of one engine (vLLM version, connectors, block size, env...)."""

    engine: str
    ts: float
    facts: dict[str, Any]


@dataclass(slots=True, frozen=True)
class LogLine:
    """A raw engine log line, kept in the per-engine log ring for snapshots."""

    engine: str
    ts: float
    line: str


class WorkloadArrival(NamedTuple):
    """A request the engine saw for the first time, with what shapes its work (None: the
    recorder did not know it)."""

    request_id: str
    ts: float  # when it arrived, unix s
    prompt_len: int | None
    max_tokens: int | None
    n: int | None
    ignore_eos: bool | None
    has_stop: bool | None


class WorkloadEnd(NamedTuple):
    """A request that left the engine: how it finished (None: not known)."""

    request_id: str
    ts: float
    output_len: int | None
    finish: str | None
    cached_tokens: int | None


@dataclass(slots=True, frozen=True)
class WorkloadBatch:
    """Requests arriving at or leaving one engine, in the order its recorder wrote them (the
    ``W`` records of one read of its ring), for the workload log that replay reproduces. One
    batch a read, a tuple a request: no dict or record object per request."""

    engine: str
    ts: float  # the newest record's time
    # (a ring read's records come as columns, ``collector.channel.work_columns.WorkColumns``,
    # which read as this sequence of tuples)
    records: Sequence[WorkloadArrival | WorkloadEnd]


@dataclass(slots=True)
class SourceStatus:
    """A source's own health, as data (served on /api/v1/sources and as a gauge)."""

    name: str
    up: bool
    supported: bool = True
    reason: str = ""
    last_ok: float | None = None
    errors: int = 0
    details: dict[str, Any] = field(default_factory=dict)  # source-specific figures (durations...)


Observation = StepRecord | StepHalves | GpuSample | Event | MetricsScrape | Fingerprint | LogLine | WorkloadBatch


def now() -> float:
    return time.time()
