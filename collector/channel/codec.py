"""What travels in a ring record, and how it becomes the sidecar's domain records.

A payload is one tag byte and a body. ``J`` is a JSON object with a ``t`` field:

    {"t": "meta", "engine": "decode-0", "engine_index": 0, "role": "stats", "pid": 1234,
     "vllm_version": "0.32.0"}
    {"t": "fp", "engine": ..., "facts": {...}}                       deployment fingerprint
    {"t": "step", "engine": ..., "step": 812, "ts": ..., "running": 4, ...StepRecord fields}
    {"t": "req", "engine": ..., "step": 812, "ts": ...,
     "cols": ["id", "prompt_len", "computed", "output", "preempt", "status", "mirror_rows"],
     "rows": [["req-1", 32000, 32512, 512, 0, "running", 8], ...]}
    {"t": "ev", "engine": ..., "kind": "cuda_error", "ts": ..., "message": ..., ...Event fields}

Rows are lists, not objects, because the per-request record is the hot one: at 256 running
requests it is most of the bytes a step writes.
"""

from __future__ import annotations

import json
from typing import Any

from collector.model import (
    Event,
    EventKind,
    Fingerprint,
    Observation,
    RequestRow,
    Severity,
    StepRecord,
)

TAG_JSON = b"J"
REQ_COLS = ("id", "prompt_len", "computed", "output", "preempt", "status", "mirror_rows")
_STEP_FIELDS = {
    "running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens", "generation_tokens",
    "finished", "waiting_by_reason", "prefix_cache_queries", "prefix_cache_hits", "connector",
    "engine_index", "worker",
}  # fmt: skip
_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode


class CodecError(ValueError):
    """A payload that is not one of ours (unknown tag, bad JSON, missing fields)."""


def encode(obj: dict[str, Any]) -> bytes:
    return TAG_JSON + _dumps(obj).encode()


def encode_step(step: StepRecord) -> bytes:
    body: dict[str, Any] = {"t": "step", "engine": step.engine, "step": step.step, "ts": step.ts}
    for name in _STEP_FIELDS:
        body[name] = getattr(step, name)
    return encode(body)


def encode_requests(engine: str, step: int, ts: float, rows: list[RequestRow]) -> bytes:
    return encode(
        {
            "t": "req",
            "engine": engine,
            "step": step,
            "ts": ts,
            "cols": list(REQ_COLS),
            "rows": [
                [r.request_id, r.prompt_len, r.computed_tokens, r.output_tokens, r.preemptions,
                 r.status, r.mirror_rows]
                for r in rows
            ],
        }
    )  # fmt: skip


def encode_fingerprint(fp: Fingerprint) -> bytes:
    return encode({"t": "fp", "engine": fp.engine, "ts": fp.ts, "facts": fp.facts})


def encode_event(ev: Event) -> bytes:
    body = ev.to_dict()
    body["t"] = "ev"
    return encode(body)


def decode(payload: bytes, *, engine: str | None = None) -> tuple[dict[str, Any] | None, Observation | None]:
    """Return (meta, observation): exactly one is set. ``engine`` overrides the record's name."""
    if not payload or payload[:1] != TAG_JSON:
        raise CodecError(f"unknown record tag {payload[:1]!r}")
    try:
        body = json.loads(payload[1:])
    except ValueError as exc:
        raise CodecError(f"bad JSON record: {exc}") from exc
    if not isinstance(body, dict):
        raise CodecError("record is not an object")
    kind = body.get("t")
    name = engine or str(body.get("engine") or "unknown")
    try:
        if kind == "meta":
            return body, None
        if kind == "step":
            fields = {k: body[k] for k in _STEP_FIELDS if k in body}
            return None, StepRecord(engine=name, ts=float(body["ts"]), step=int(body["step"]), **fields)
        if kind == "req":
            return None, _decode_requests(name, body)
        if kind == "fp":
            return None, Fingerprint(engine=name, ts=float(body.get("ts", 0.0)), facts=dict(body["facts"]))
        if kind == "ev":
            return None, _decode_event(name, body)
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecError(f"malformed {kind!r} record: {exc}") from exc
    raise CodecError(f"unknown record type {kind!r}")


def _decode_requests(engine: str, body: dict[str, Any]) -> StepRecord:
    cols = body.get("cols") or list(REQ_COLS)
    idx = {c: i for i, c in enumerate(cols)}
    rows: list[RequestRow] = []
    for row in body["rows"]:

        def col(name: str, default: Any = None, row: list[Any] = row) -> Any:
            i = idx.get(name)
            return row[i] if i is not None and i < len(row) else default

        extras = {c: row[i] for c, i in idx.items() if c not in REQ_COLS and i < len(row)}
        rows.append(
            RequestRow(
                request_id=str(col("id")),
                prompt_len=int(col("prompt_len", 0) or 0),
                computed_tokens=int(col("computed", 0) or 0),
                output_tokens=int(col("output", 0) or 0),
                preemptions=int(col("preempt", 0) or 0),
                status=str(col("status", "running")),
                mirror_rows=None if col("mirror_rows") is None else int(col("mirror_rows")),
                extras=extras,
            )
        )
    running = sum(1 for r in rows if r.status == "running")
    return StepRecord(engine=engine, ts=float(body["ts"]), step=int(body["step"]), running=running, requests=rows)


def _decode_event(engine: str, body: dict[str, Any]) -> Event:
    return Event(
        kind=EventKind(body["kind"]),
        ts=float(body["ts"]),
        source=str(body.get("source") or "recorder"),
        message=str(body.get("message", "")),
        severity=Severity(body.get("severity", "warning")),
        engine=engine,
        gpu=body.get("gpu"),
        xid=body.get("xid"),
        pid=body.get("pid"),
        process=body.get("process"),
        frames=list(body.get("frames") or []),
        lines=list(body.get("lines") or []),
        data=dict(body.get("data") or {}),
    )
