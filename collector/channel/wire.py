"""Internal: the ring records' wire format, writing side: the tags, the binary heads, the status codes and
the encoders the engine-side recorder calls (``collector.channel.codec`` describes the format and
decodes it). Standard library only: this is what an engine process imports of the format, and it
must not load the sidecar's domain model (``collector.model``) into vLLM's process.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from collector.channel import fields as f

TAG_JSON = b"J"
TAG_STEP = b"S"
TAG_REQS = b"R"
TAG_WORK = b"W"
STEP_HEAD = struct.Struct("<QdHIIIdIIIIQQ")
REQS_HEAD = struct.Struct("<QdIB")
WORK_HEAD = struct.Struct("<BBBHdqqq")
WORK_ARRIVE, WORK_END = 0, 1
WORK_ID_MAX = 1024  # bytes of a request id (a longer one is cut, the same way in both records)
WORK_FINISH_MAX = 64  # bytes of a finish reason
FLAG_MIRROR = 1
FLAG_HOST_BLOCKS = 2
# An R record that leaves out its running set's columns (prompt lengths, preemptions, statuses,
# ids): they are the last full R record's of the same ring (``collector.channel.codec``).
FLAG_KEPT = 4
KEPT_MAX = 32  # records in a row that keep the columns, at most: a reader that starts anywhere finds a full one soon
# Request status codes on the wire. Ours, not vLLM's enum values, which may be renumbered.
STATUSES = (
    "running",
    "preempted",
    "waiting",
    "waiting_for_remote_kvs",
    "waiting_for_structured_output_grammar",
    "waiting_for_streaming_req",
    "finished_stopped",
    "finished_length_capped",
    "finished_aborted",
    "finished_ignored",
    "finished_error",
    "finished_repetition",
    "unknown",
)
STATUS_CODE = {name: i for i, name in enumerate(STATUSES)}
UNKNOWN_STATUS = STATUS_CODE["unknown"]
_U32_MAX = 0xFFFFFFFF
# The counters of a JSON step and the largest value each may hold: the Integer columns they are
# stored in, or a 64-bit JSON number.
_STEP_COUNTS = {
    "running": f.INT32_MAX,
    "waiting": f.INT32_MAX,
    "preemptions": f.INT32_MAX,
    "prompt_tokens": f.INT32_MAX,
    "generation_tokens": f.INT32_MAX,
    "finished": f.INT32_MAX,
    "prefix_cache_queries": f.INT64_MAX,
    "prefix_cache_hits": f.INT64_MAX,
    "engine_index": 0xFFFF,
}
_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode


def encode(obj: dict[str, Any]) -> bytes:
    return TAG_JSON + _dumps(obj).encode()


def _u32(v: int) -> int:
    return v if 0 <= v <= _U32_MAX else (0 if v < 0 else _U32_MAX)


_NULLABLE_STEP_FIELDS = (
    "running",
    "waiting",
    "deferred",
    "kv_cache_usage",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "finished",
    "prefix_cache_queries",
    "prefix_cache_hits",
)


def encode_step_fields(
    step: int,
    ts: float,
    engine_index: int,
    running: int | None,
    waiting: int | None,
    deferred: int | None,
    kv_cache_usage: float | None,
    preemptions: int | None,
    prompt_tokens: int | None,
    generation_tokens: int | None,
    finished: int | None,
    prefix_cache_queries: int | None,
    prefix_cache_hits: int | None,
    extras: dict[str, Any] | None = None,
) -> bytes:
    """The hot path of the stat logger: one struct, JSON only when there are extras.

    A field passed as None is one the writer could not read: its slot holds 0 and its name goes
    into the extras' ``"null"`` list, so the reader stores null, never a made-up 0.
    """
    values = (
        running,
        waiting,
        deferred,
        kv_cache_usage,
        preemptions,
        prompt_tokens,
        generation_tokens,
        finished,
        prefix_cache_queries,
        prefix_cache_hits,
    )
    if None in values:
        nulls = [name for name, v in zip(_NULLABLE_STEP_FIELDS, values, strict=True) if v is None]
        extras = dict(extras or {})
        extras["null"] = sorted({*extras.get("null", ()), *nulls})
    head = STEP_HEAD.pack(
        step,
        ts,
        engine_index & 0xFFFF,
        _u32(running or 0),
        _u32(waiting or 0),
        _u32(deferred or 0),
        kv_cache_usage or 0.0,
        _u32(preemptions or 0),
        _u32(prompt_tokens or 0),
        _u32(generation_tokens or 0),
        _u32(finished or 0),
        prefix_cache_queries or 0,
        prefix_cache_hits or 0,
    )
    if extras:
        return TAG_STEP + head + _dumps(extras).encode()
    return TAG_STEP + head


def encode_request_columns(
    step: int,
    ts: float,
    n: int,
    ids_blob: bytes,
    prompt_lens: bytes,
    computed: bytes,
    output: bytes,
    preemptions: bytes,
    status_codes: bytes,
    mirror_rows: bytes | None = None,
    host_blocks: bytes | None = None,
) -> bytes:
    """The hot path of the scheduler: pre-encoded columns in, one payload out.

    Columns are the bytes of ``array("I")`` (``array("i")`` for mirror rows and host blocks,
    -1 = unknown) of ``n`` items; ``ids_blob`` is the ids joined by NUL, UTF-8. A writer builds
    each column straight from a ``map`` (no intermediate list) and reuses the ones that did not
    change. A column passed as None is left out and its flag bit stays clear.
    """
    flags = (FLAG_MIRROR if mirror_rows is not None else 0) | (FLAG_HOST_BLOCKS if host_blocks is not None else 0)
    parts = [TAG_REQS + REQS_HEAD.pack(step, ts, n, flags), prompt_lens, computed, output, preemptions, status_codes]
    if mirror_rows is not None:
        parts.append(mirror_rows)
    if host_blocks is not None:
        parts.append(host_blocks)
    parts.append(ids_blob)
    return b"".join(parts)


def encode_arrival(
    request_id: str,
    ts: float,
    prompt_len: int | None,
    max_tokens: int | None,
    n: int | None,
    ignore_eos: bool | None,
    has_stop: bool | None,
) -> bytes:
    """A ``W`` arrival: the recorder's once-per-request path (None: not known, kept as null)."""
    nulls, counts = _work_counts(prompt_len, max_tokens, n)
    flags = 0
    if ignore_eos is None:
        nulls |= _NULL_FLAG3
    elif ignore_eos:
        flags |= 1
    if has_stop is None:
        nulls |= _NULL_FLAG4
    elif has_stop:
        flags |= 2
    rid = _work_id(request_id)
    return TAG_WORK + WORK_HEAD.pack(WORK_ARRIVE, nulls, flags, len(rid), ts, *counts) + rid


def encode_end(request_id: str, ts: float, output_len: int | None, finish: str | None, cached_tokens: int | None) -> bytes:
    """A ``W`` end: how the request left the engine (None: not known, kept as null)."""
    nulls, counts = _work_counts(output_len, cached_tokens, 0)
    reason = b""
    if finish is None:
        nulls |= _NULL_FLAG3
    else:
        reason = finish.encode()
        if len(reason) > WORK_FINISH_MAX or b"\0" in reason:
            reason = _cut(reason.replace(b"\0", b""), WORK_FINISH_MAX)
    rid = _work_id(request_id)
    return TAG_WORK + WORK_HEAD.pack(WORK_END, nulls, 0, len(rid), ts, *counts) + rid + reason


_NULL_FLAG3, _NULL_FLAG4 = 8, 16
_WORK_NULLS = (0b11111, 0b01011)  # the null bits an arrival and an end may set
_WORK_FLAGS = (0b11, 0)


def _work_counts(*values: int | None) -> tuple[int, list[int]]:
    """The three count slots and their null bits: None, or a value the slot cannot hold (not an
    int, negative, beyond 64 bits), is unknown."""
    nulls = 0
    out = [0, 0, 0]
    for i, v in enumerate(values):
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= f.INT64_MAX:
            out[i] = int(v)
        else:
            nulls |= 1 << i
    return nulls, out


def _cut(raw: bytes, limit: int) -> bytes:
    """At most ``limit`` bytes of UTF-8, cut at a character's start."""
    return raw[:limit].decode("utf-8", "ignore").encode()


def _work_id(request_id: str) -> bytes:
    rid = request_id.encode()
    if len(rid) > WORK_ID_MAX or b"\0" in rid:
        rid = _cut(rid.replace(b"\0", b""), WORK_ID_MAX)
    return rid
