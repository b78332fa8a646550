"""The snapshot document: what a crash snapshot holds, and its versioned export format.

The export (``GET /api/v1/snapshots/{id}/export``, ``flightrec snapshots export ID``) is one
gzip JSON object::

    {"schema": "flightrec.snapshot/v1", "id": 12, "incident_id": 3, "host": "node-a",
     "engine": "decode-0", "created_at": 1796045430.1, "fault_ts": 1796045429.9,
     "trigger": {Event fields: kind, source, ts, message, severity, xid, process, frames, ...},
     "summary": {"last_step": 9120, "running": 16, "kv_cache_usage": 0.032, ...},
     "fingerprint": {"vllm_version": ..., "kv_transfer_config": ..., "env": {...}, ...},
     "steps": [{"step", "ts", "running", "waiting", "kv_cache_usage", "preemptions",
                "prompt_tokens", "generation_tokens", "mirror_rows", "connector", ...}],
     "requests": [{"step", "request_id", "prompt_len", "computed_tokens", "output_tokens",
                   "preemptions", "status", "mirror_rows"}],
     "gpu_samples": [GpuSample fields], "events": [Event fields],
     "log_lines": [{"ts", "line"}]}

Times are unix seconds. Fields may be added within v1; none are removed or renamed.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "flightrec.snapshot/v1"
PARTS = ("steps", "requests", "gpu_samples", "events", "log_lines")


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
    requests: list[dict[str, Any]] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    log_lines: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None
    incident_id: int | None = None

    def part(self, name: str) -> list[dict[str, Any]]:
        return getattr(self, name)  # type: ignore[no-any-return]

    def to_export(self) -> dict[str, Any]:
        out: dict[str, Any] = {
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
        for name in PARTS:
            out[name] = self.part(name)
        return out


def pack(obj: Any) -> bytes:
    # level 1: a 4096x64 snapshot compresses ~10x at a fraction of level 9's time.
    return gzip.compress(json.dumps(obj, separators=(",", ":"), default=str).encode(), compresslevel=1)


def unpack(blob: bytes) -> Any:
    return json.loads(gzip.decompress(blob))
