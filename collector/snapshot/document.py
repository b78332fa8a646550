"""The snapshot document: what a crash snapshot holds, and its versioned export format.

The export (``GET /api/v1/snapshots/{id}``, ``GET /api/v1/snapshots/{id}/export``,
``flightrec snapshots export ID``) is one JSON object, served gzip-compressed::

    {"schema": "flightrec.snapshot/v1", "id": 12, "incident_id": 3, "host": "node-a",
     "engine": "decode-0", "created_at": 1796045430.1, "fault_ts": 1796045429.9,
     "trigger": {Event fields: kind, source, ts, message, severity, xid, process, frames, ...},
     "summary": {"last_step": 9120, "running": 16, "kv_cache_usage": 0.032, ...},
     "fingerprint": {"vllm_version": ..., "kv_transfer_config": ..., "env": {...}, ...},
     "steps": [{"step", "ts", "running", "waiting", "kv_cache_usage", "preemptions",
                "prompt_tokens", "generation_tokens", "mirror_rows", "connector", "details", ...}],
     "requests": {"columns": {"step": [...], "request_id": [...], "prompt_len": [...],
                              "computed_tokens": [...], "output_tokens": [...],
                              "preemptions": [...], "status": [...], "mirror_rows": [...]},
                  "sparse": ["extras"]},
     "gpu_samples": [GpuSample fields], "events": [Event fields],
     "log_lines": [{"ts", "line"}],
     "peers": [{"host", "engine", "pair", "role", "fingerprint"}],
     "scrapes": [{"ts", "values": {...}, "rates": {...}}],
     "workload": {"schema": "flightrec.workload/v1", "requests": {"columns": {...}},
                  "concurrency": [[offset, in_flight], ...], "window", "truncated", ...} | null,
     "stacks": {"schema": "flightrec.stacks/v1", "status", "reasons", "processes": [...],
                "env", "gpus", ...}}                        a wedge's snapshot only

``requests`` is columnar: row ``i`` is ``{name: columns[name][i]}``; a column listed in
``sparse`` is left out of a row where its value is null. A 4096-step x 64-request snapshot
is 262k rows: as row objects that is 40 MB of JSON and seconds to encode, as columns a
third of the size and four times faster, which is what keeps fault-to-durable-snapshot
under half a second. In Python, ``SnapshotDoc.requests`` is a ``RequestTable`` that still
reads as a sequence of row dicts.

Times are unix seconds. Fields may be added within v1; none are removed or renamed.
``workload`` (the requests before the fault, for ``flightrec replay``: collector.ingest.workload)
was added within v1: a snapshot stored without it reads and exports it as null. ``stacks`` (the
Python stacks of every process of a wedged engine, read twice a few seconds apart, with its GPUs
and environment: collector/stacks/part.py, its own ``schema`` inside) was added within v1 as an
*optional* part: a snapshot holds it only when its trigger was a wedge, and the export of any
other snapshot has no ``stacks`` key at all (not a null), so what older readers and the golden
export see of a crash snapshot is unchanged.

Each part is stored as a gzip member whose deflate body ends on a full flush, so the API
splices the stored bytes of all parts into one gzip stream without decompressing them
(``assemble_gzip``): fetching a 4096 x 64 snapshot costs a database read, not a re-encode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from collector.model import StepRequests

SCHEMA = "flightrec.snapshot/v1"
PARTS = ("steps", "requests", "gpu_samples", "events", "log_lines", "peers", "workload", "scrapes", "stacks")
NULLABLE_PARTS = frozenset({"workload", "stacks"})  # absent (older snapshots, no recorder) = null, not []
OPTIONAL_PARTS = frozenset({"stacks"})  # absent = no key in the export, and no stored row
HEADER_FIELDS = ("schema", "id", "incident_id", "host", "engine", "created_at", "fault_ts", "trigger", "summary", "fingerprint")
ENCODING = "json+gzip-seg"  # a gzip member whose body can be spliced (see pack)


class RequestTable(Sequence[dict[str, Any]]):
    """Per-request rows held as columns; reads as a sequence of row dicts.

    A table frozen from the rings holds the recorder's own blocks
    (``collector.channel.blocks.RequestBlock``) and decodes them into columns only when
    something reads them; its stored form is those blocks, compressed (``stored_blob``)."""

    __slots__ = ("_columns", "sparse", "_n", "_blocks")

    def __init__(self, columns: dict[str, list[Any]] | None = None, sparse: Iterable[str] = ()) -> None:
        self._columns: dict[str, list[Any]] | None = dict(columns or {})
        self.sparse = frozenset(sparse)
        self._blocks: list[StepRequests] | None = None
        lengths = {len(v) for v in self._columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"request columns differ in length: {sorted(lengths)}")
        self._n = lengths.pop() if lengths else 0

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]]) -> RequestTable:
        rows = list(rows)
        names: dict[str, None] = {}
        for r in rows:
            for k in r:
                names.setdefault(k, None)
        sparse = [k for k in names if any(k not in r for r in rows)]
        return cls({k: [r.get(k) for r in rows] for k in names}, sparse)

    @classmethod
    def from_blocks(cls, blocks: Sequence[StepRequests]) -> RequestTable:
        """From the rings' request blocks: nothing decoded until read."""
        table = cls()
        table._columns = None
        # (a block whose bytes are gone keeps its step's figures, and has no rows)
        table._blocks = [b for b in blocks if not getattr(b, "gone", False)]
        table._n = sum(b.n for b in table._blocks)
        return table

    @property
    def columns(self) -> dict[str, list[Any]]:
        if self._columns is None:
            from collector.channel.blocks import decode_columns

            self._columns = decode_columns(self._blocks or [])
        return self._columns

    @property
    def blocks(self) -> list[StepRequests] | None:
        return self._blocks

    def stored_blob(self) -> bytes:
        """The stored form: the recorder's blocks compressed, else this table's JSON gzip."""
        if self._blocks is not None:
            from collector.channel.blocks import pack_blocks

            return pack_blocks(self._blocks)
        return pack(self)

    def json_bytes(self) -> bytes:
        return dumps(self.to_json())

    @classmethod
    def coerce(cls, value: Any) -> RequestTable:
        if isinstance(value, RequestTable):
            return value
        if isinstance(value, (bytes, bytearray)):
            return cls.from_stored(bytes(value))
        if isinstance(value, dict):
            return cls(value.get("columns") or {}, value.get("sparse") or ())
        if value is None:
            return cls()
        return cls.from_rows(value)

    @classmethod
    def from_stored(cls, blob: bytes) -> RequestTable:
        """A stored ``requests`` part, in either form."""
        from collector.channel.blocks import is_block_blob, unpack_blocks

        if is_block_blob(blob):
            return cls.from_blocks(unpack_blocks(blob))
        return cls.coerce(unpack(blob))

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "sparse": sorted(self.sparse)}

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> dict[str, Any]:
        out = {}
        for k, col in self.columns.items():
            v = col[i]
            if v is None and k in self.sparse:
                continue
            out[k] = v
        return out

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("request row out of range")
        return self._row(i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._row(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RequestTable):
            return self.to_json() == other.to_json()
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"RequestTable({self._n} rows, columns={list(self.columns)})"


@dataclass
class SnapshotDoc:
    host: str
    engine: str
    created_at: float
    fault_ts: float
    trigger: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    requests: RequestTable = field(default_factory=RequestTable)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    log_lines: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None
    incident_id: int | None = None
    # fingerprints of the other engines of this engine's P/D pair, as stored at commit
    peers: list[dict[str, Any]] = field(default_factory=list)
    # the requests before the fault (WorkloadLog.export), null when nothing recorded them
    workload: dict[str, Any] | None = None
    # the engine's /metrics scrapes of the last minutes (``summary.scrape_interval_s`` apart)
    scrapes: list[dict[str, Any]] = field(default_factory=list)
    # a wedged engine's stacks (collector.stacks.part), None for every other trigger
    stacks: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.requests = RequestTable.coerce(self.requests)

    def part(self, name: str) -> Any:
        return getattr(self, name)

    def set_part(self, name: str, value: Any) -> None:
        if name in NULLABLE_PARTS:
            setattr(self, name, value or None)
            return
        setattr(self, name, RequestTable.coerce(value) if name == "requests" else (value or []))

    def counts(self) -> dict[str, Any]:
        """What the ``snapshots`` row keeps of the parts (lists show it without reading them)."""
        return {
            "step_count": len(self.steps),
            "request_rows": len(self.requests),
            "first_step": self.steps[0]["step"] if self.steps else None,
            "last_step": self.steps[-1]["step"] if self.steps else None,
        }

    def header(self) -> dict[str, Any]:
        """The export's fields other than the parts."""
        return {
            "schema": SCHEMA,
            "id": self.id,
            "incident_id": self.incident_id,
            "host": self.host,
            "engine": self.engine,
            "created_at": self.created_at,
            "fault_ts": self.fault_ts,
            "trigger": self.trigger,
            "summary": self.summary,
            "fingerprint": self.fingerprint,
        }

    def to_export(self) -> dict[str, Any]:
        out = self.header()
        for name in PARTS:
            value = self.part(name)
            if value is None and name in OPTIONAL_PARTS:
                continue
            out[name] = value.to_json() if isinstance(value, RequestTable) else value
        return out

    @classmethod
    def from_export(cls, data: dict[str, Any]) -> SnapshotDoc:
        known = set(HEADER_FIELDS) | set(PARTS)
        kwargs = {k: v for k, v in data.items() if k in known and k != "schema"}
        return cls(**kwargs)


from collector.snapshot.compression import (  # noqa: E402 - the byte layer, re-exported for callers
    Segment,
    assemble_gzip,
    crc32_combine,
    deflate_segment,
    dumps,
    pack,
    segment_of,
    unpack,
)

__all__ = [
    "OPTIONAL_PARTS",
    "PARTS",
    "SCHEMA",
    "RequestTable",
    "Segment",
    "SnapshotDoc",
    "assemble_gzip",
    "crc32_combine",
    "deflate_segment",
    "dumps",
    "export_gzip",
    "pack",
    "segment_of",
    "unpack",
]


def _empty_part(name: str) -> Any:
    if name in NULLABLE_PARTS:
        return None
    return {"columns": {}, "sparse": []} if name == "requests" else []


def export_gzip(header: dict[str, Any], parts: dict[str, bytes]) -> bytes:
    """The whole export as one gzip stream, from the header and the parts' stored blobs.

    A part stored in another form (or missing) is decoded and re-encoded (or served empty)."""
    text = dumps(header)
    pieces: list[bytes | Segment] = [text[:-1]]
    for name in PARTS:
        blob = parts.get(name)
        if blob is None and name in OPTIONAL_PARTS:
            continue
        seg = segment_of(blob) if blob is not None else None
        if seg is None:
            if name == "requests" and blob is not None:
                value = RequestTable.from_stored(blob).to_json()  # decoded on read
            else:
                value = unpack(blob) if blob is not None else _empty_part(name)
            seg = deflate_segment(dumps(value))
        pieces.append(f',"{name}":'.encode())
        pieces.append(seg)
    pieces.append(b"}")
    return assemble_gzip(pieces)
