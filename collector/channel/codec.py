"""What travels in a ring record, and how it becomes the sidecar's domain records.

A payload is one tag byte and a body. Two tags are binary, because they are written on vLLM's
per-step path and must cost microseconds; the rare records are JSON.

``S``: one engine step from the stat logger (little endian)::

    <QdHIIIdIIIIQQ  step, ts, engine_index, running, waiting, deferred, kv_cache_usage,
                    preemptions, prompt_tokens, generation_tokens, finished,
                    prefix_cache_queries, prefix_cache_hits
    [JSON object]   only when there is more: {"connector": {...}, "waiting_by_reason": {...},
                    "worker": ..., "null": [...],
                    "iteration": {...}, "cudagraph": {...}, "external_prefix_cache": {...}}
                    (the last three as docs/recorder.md describes them)

``waiting`` counts every waiting request; ``waiting_by_reason`` is rebuilt from ``waiting -
deferred`` (``capacity``) and ``deferred``, the split vLLM's own ``/metrics`` uses.

``R``: the running requests of one step, from the RecordingScheduler. A full record::

    <QdIB           step, ts, n, flags (bit 0: a mirror-rows column follows;
                    bit 1: a host-blocks column follows; bit 2: clear)
    u32[n] prompt_len, u32[n] computed, u32[n] output, u32[n] preemptions, u8[n] status code,
    [i32[n] mirror_rows, -1 where unknown], [i32[n] host_blocks, -1 where unknown],
    then the n request ids, UTF-8, joined by NUL

A record with flag bit 2 set (``FLAG_KEPT``) carries only what changes from step to step while
the running set does not::

    <QdIB           step, ts, n, flags
    u32[n] computed, u32[n] output, [i32[n] mirror_rows], [i32[n] host_blocks]

its prompt lengths, preemptions, statuses and ids are those of the last full ``R`` record before
it in the same ring, which has the same ``n``. The writer writes a full record when the running
set changes and at least every ``KEPT_MAX`` + 1 records, so a reader that starts anywhere in
the ring, or finds a break in its records (lost to the writer, skipped as corrupt), sets aside
at most ``KEPT_MAX`` records before it can decode again; a reader decodes such records in ring
order, following their places (``collector.channel.blocks.RequestRecords``).

``mirror_rows``: the host-mirror rows the HiSparse connector scheduled for the request this
step (``HiSparseConnectorMetadata.row_mirrors``); ``host_blocks``: the host blocks the HiSparse
coordinator holds for it. Both are -1 where the recorder could not read them.

In an ``S`` record's JSON extras, ``"null": ["prefix_cache_queries", ...]`` names the fixed
fields the recorder could not read (their binary slots hold 0): the sidecar stores them as
null, never as 0.

``W``: a request arriving at or leaving the engine (once each, never per step), the workload a
replay reproduces::

    <BBBHdqqq       event (0 arrive, 1 end), nulls, flags, id length, ts (unix s; an arrival's
                    is when the request arrived), then three counts:
                    arrive: prompt_len, max_tokens, n;  end: output_len, cached_tokens, 0
    the request id, UTF-8 without NUL (id length bytes); an end then its finish reason, UTF-8,
    to the record's end ("stopped" | "length" | "aborted" | "error" | another vLLM status name)

``nulls`` names what the recorder did not know (bit i: count i, its slot 0; bit 3: an
arrival's ``ignore_eos`` or an end's finish reason, which is then absent; bit 4: an arrival's
``has_stop``): the sidecar keeps them as null, never as 0. ``flags`` holds an arrival's
``ignore_eos`` (bit 0) and ``has_stop`` (bit 1). Any other bit set, a length that does not add
up, a negative count or an id with a NUL is a ``CodecError``.

``J``: a JSON object with a ``t`` field, for everything else::

    {"t": "meta", "engine": "decode-0", "engine_index": 0, "role": "stats", "pid": 1234,
     "vllm_version": "0.32.0"}
    {"t": "fp", "engine": ..., "ts": ..., "facts": {...}}           deployment fingerprint
    {"t": "ev", "engine": ..., "kind": "cuda_error", "ts": ..., ...Event fields}

Steps, request rows and the workload travel only as ``S``, ``R`` and ``W`` records (the JSON
``wl`` records of format 2 recorders were two JSON parses per step at a node's load); a JSON
record of another type is set aside and counted, as any record that is not one of ours.

Every field of a JSON record is checked against the column it ends in (``channel.fields``): a
wrong type, a number out of range or a NaN is a ``CodecError``, so the reader sets the record
aside and counts it instead of handing the writer a value the database refuses.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from collector.channel import fields as f
from collector.channel.wire import (  # the writing side is defined there; named here for every reader
    _NULL_FLAG3,
    _NULL_FLAG4,
    _NULLABLE_STEP_FIELDS,
    _WORK_FLAGS,
    _WORK_NULLS,
    FLAG_HOST_BLOCKS,
    FLAG_KEPT,
    FLAG_MIRROR,
    KEPT_MAX,
    REQS_HEAD,
    STATUS_CODE,
    STATUSES,
    STEP_HEAD,
    TAG_JSON,
    TAG_REQS,
    TAG_STEP,
    TAG_WORK,
    UNKNOWN_STATUS,
    WORK_ARRIVE,
    WORK_END,
    WORK_FINISH_MAX,
    WORK_HEAD,
    WORK_ID_MAX,
    encode,
    encode_arrival,
    encode_end,
    encode_request_columns,
    encode_step_fields,
)
from collector.errors import InputError
from collector.model import (
    HALF_REQUESTS,
    HALF_STATS,
    STEP_DETAIL_KEYS,
    Event,
    EventKind,
    Fingerprint,
    Observation,
    Severity,
    StepRecord,
    WorkloadArrival,
    WorkloadBatch,
    WorkloadEnd,
)

__all__ = [  # the writing side's names are defined in collector.channel.wire
    "CodecError",
    "Decoded",
    "FLAG_HOST_BLOCKS",
    "FLAG_KEPT",
    "FLAG_MIRROR",
    "KEPT_MAX",
    "REQS_HEAD",
    "STATUSES",
    "STATUS_CODE",
    "STEP_HEAD",
    "TAG_JSON",
    "TAG_REQS",
    "TAG_STEP",
    "TAG_WORK",
    "UNKNOWN_STATUS",
    "WORK_ARRIVE",
    "WORK_END",
    "WORK_FINISH_MAX",
    "WORK_HEAD",
    "WORK_ID_MAX",
    "decode",
    "decode_many",
    "decode_work",
    "encode",
    "encode_arrival",
    "encode_end",
    "encode_event",
    "encode_fingerprint",
    "encode_request_columns",
    "encode_step",
    "encode_step_fields",
]

if TYPE_CHECKING:  # blocks imports this module
    from collector.channel.blocks import RequestBlock, RequestRecords


class CodecError(InputError):
    """A payload that is not one of ours (unknown tag, bad JSON, missing fields)."""


def encode_step(step: StepRecord) -> bytes:
    """A StepRecord as an ``S`` record (tests, simulators): a None figure is sent as 0 and named
    in the extras' ``"null"`` list, so it arrives as None."""
    deferred = int(step.waiting_by_reason.get("deferred", 0))
    extras: dict[str, Any] = {}
    if step.connector:
        extras["connector"] = step.connector
    other = {k: v for k, v in step.waiting_by_reason.items() if k not in ("capacity", "deferred")}
    if other:
        extras["waiting_by_reason"] = other
    if step.worker is not None:
        extras["worker"] = step.worker
    extras.update(step.details)
    return encode_step_fields(
        step.step,
        step.ts,
        step.engine_index,
        step.running,
        step.waiting,
        deferred,
        step.kv_cache_usage,
        step.preemptions,
        step.prompt_tokens,
        step.generation_tokens,
        step.finished,
        step.prefix_cache_queries,
        step.prefix_cache_hits,
        extras,
    )


def encode_fingerprint(fp: Fingerprint) -> bytes:
    return encode({"t": "fp", "engine": fp.engine, "ts": fp.ts, "facts": fp.facts})


def encode_event(ev: Event) -> bytes:
    body = ev.to_dict()
    body["t"] = "ev"
    return encode(body)


def decode(payload: bytes, *, engine: str | None = None, requests: RequestRecords | None = None) -> tuple[dict[str, Any] | None, Observation | None]:
    """Return (meta, observation): exactly one is set. ``engine`` names the engine of binary
    records (which do not carry it) and overrides the name in JSON ones. ``requests``: the ring's
    ``R`` decoder, for records that keep an earlier record's running set (read in ring order);
    without it such a record is a ``CodecError``."""
    try:
        return _decode(payload, engine, requests)
    except RecursionError as exc:  # json.loads of a deeply nested array, in either form
        raise CodecError("record nested too deeply") from exc


def _decode(payload: bytes, engine: str | None, requests: RequestRecords | None = None) -> tuple[dict[str, Any] | None, Observation | None]:
    tag = payload[:1]
    name = engine or "unknown"
    if tag == TAG_STEP:
        return None, _decode_step_binary(name, payload)
    if tag == TAG_REQS:
        return None, _decode_request_block(name, payload, requests)
    if tag == TAG_WORK:
        rec = decode_work(payload)
        return None, WorkloadBatch(engine=name, ts=rec.ts, records=[rec])
    if tag != TAG_JSON:
        raise CodecError(f"unknown record tag {tag!r}")
    try:
        body = json.loads(payload[1:])
    except ValueError as exc:
        raise CodecError(f"bad JSON record: {exc}") from exc
    if not isinstance(body, dict):
        raise CodecError("record is not an object")
    kind = body.get("t")
    try:
        name = engine or f.text(body, "engine", default="unknown", limit=f.NAME_MAX) or "unknown"
        if kind == "meta":
            return body, None
        if kind == "fp":
            facts = body.get("facts")
            if not isinstance(facts, dict):
                raise f.FieldError("facts is not an object")
            return None, Fingerprint(engine=name, ts=f.timestamp(body, default=0.0), facts=facts)
        if kind == "ev":
            return None, _decode_event(name, body)
    except (KeyError, TypeError, ValueError) as exc:  # FieldError included
        raise CodecError(f"malformed {str(kind)[:40]!r} record: {exc}") from exc
    raise CodecError(f"unknown record type {str(kind)[:40]!r}")


Decoded = tuple[dict[str, Any] | None, Observation | None, CodecError | None]
_STEP_SIZE = 1 + STEP_HEAD.size
_STEP_TAG = TAG_STEP[0]
_PLAIN_STEP = struct.Struct("<x" + STEP_HEAD.format.lstrip("<"))  # a whole S record without extras


def decode_many(payloads: Sequence[bytes | memoryview], *, engine: str | None = None) -> list[Decoded]:
    """Every payload of one read, in order, as (meta, observation, error): exactly one is set.
    A payload may be a view of the ring read's copy (``RingReader.read_views``): nothing
    returned holds one.

    The S records without extras (most steps) are decoded together: one ``struct.iter_unpack``
    over their joined bytes and a step record built from each tuple, with none of ``decode``'s
    per-record dispatch. R records become request blocks straight from their views. The read's
    W records become one ``WorkloadBatch``, in their order, at the place of the first (a bad
    one is its own error, in its place). Every other record goes through ``decode``."""
    plain = [p for p in payloads if len(p) == _STEP_SIZE and p[0] == _STEP_TAG]
    heads = _PLAIN_STEP.iter_unpack(b"".join(plain)) if plain else iter(())
    name = engine or "unknown"
    out: list[Decoded] = []
    work: list[WorkloadArrival | WorkloadEnd] = []
    work_at = -1  # the batch's place in out: the first sound W record's
    work_ts = 0.0
    requests: RequestRecords | None = None  # the R records' decoder, made at the first
    for payload in payloads:
        tag = payload[0] if payload else -1
        if tag == _STEP_TAG and len(payload) == _STEP_SIZE:
            out.append((None, _step_of(name, next(heads), None), None))
            continue
        if tag == _REQS_TAG:
            try:
                if requests is None:
                    requests = _records_type()()
                out.append((None, _decode_request_block(name, payload, requests), None))
            except CodecError as exc:
                out.append((None, None, exc))
            continue
        if tag == _WORK_TAG:
            try:
                rec = decode_work(payload)
            except CodecError as exc:
                out.append((None, None, exc))
                continue
            if work_at < 0:
                work_at, work_ts = len(out), rec.ts
                out.append((None, None, None))  # the batch, once its records are all in
            elif rec.ts > work_ts:
                work_ts = rec.ts
            work.append(rec)
            continue
        try:
            meta, obs = decode(bytes(payload), engine=engine)
        except CodecError as exc:
            out.append((None, None, exc))
            continue
        out.append((meta, obs, None))
    if work_at >= 0:
        out[work_at] = (None, WorkloadBatch(engine=name, ts=work_ts, records=work), None)
    return out


_WORK_TAG = TAG_WORK[0]
_REQS_TAG = TAG_REQS[0]
_WORK_SIZE = 1 + WORK_HEAD.size
_unpack_work = WORK_HEAD.unpack_from
_isfinite = math.isfinite


def decode_work(payload: bytes | memoryview) -> WorkloadArrival | WorkloadEnd:
    """A ``W`` record as its arrival or end; anything that does not add up is a ``CodecError``."""
    if len(payload) < _WORK_SIZE or payload[0] != _WORK_TAG:
        raise CodecError("short workload record")
    event, nulls, flags, id_len, ts, c0, c1, c2 = _unpack_work(payload, 1)
    if event > WORK_END:
        raise CodecError(f"unknown workload event {event}")
    if nulls & ~_WORK_NULLS[event] or flags & ~_WORK_FLAGS[event] or (event == WORK_END and c2):
        raise CodecError("workload record with bits or a slot its event does not use")
    if not 0 < id_len <= WORK_ID_MAX:
        raise CodecError(f"workload record's id of {id_len} bytes (1..{WORK_ID_MAX})")
    end = _WORK_SIZE + id_len
    size = len(payload)
    if size < end or (event == WORK_ARRIVE and size != end):
        raise CodecError(f"workload record of {size} bytes for an id of {id_len}")
    if not _isfinite(ts) or ts < 0:
        raise CodecError("workload record's ts is not a time")
    if c0 < 0 or c1 < 0 or c2 < 0:
        raise CodecError("workload record with a negative count")
    try:
        rid = str(payload[_WORK_SIZE:end], "utf-8")
        reason = str(payload[end:], "utf-8") if event == WORK_END else ""
    except UnicodeDecodeError as exc:
        raise CodecError(f"workload record's text is not UTF-8: {exc}") from exc
    if "\0" in rid or "\0" in reason or len(reason) > WORK_FINISH_MAX:
        raise CodecError("workload record's id or finish reason holds a NUL or is too long")
    if nulls:
        if (nulls & 1 and c0) or (nulls & 2 and c1) or (nulls & 4 and c2) or (nulls & _NULL_FLAG3 and (reason or flags & 1)):
            raise CodecError("workload record with a value where it says unknown")
        if nulls & _NULL_FLAG4 and flags & 2:
            raise CodecError("workload record with a value where it says unknown")
    if event == WORK_ARRIVE:
        if not nulls:
            return WorkloadArrival(rid, ts, c0, c1, c2, bool(flags & 1), bool(flags & 2))
        return WorkloadArrival(
            rid,
            ts,
            None if nulls & 1 else c0,
            None if nulls & 2 else c1,
            None if nulls & 4 else c2,
            None if nulls & _NULL_FLAG3 else bool(flags & 1),
            None if nulls & _NULL_FLAG4 else bool(flags & 2),
        )
    if not nulls:
        return WorkloadEnd(rid, ts, c0, reason, c1)
    return WorkloadEnd(rid, ts, None if nulls & 1 else c0, None if nulls & _NULL_FLAG3 else reason, None if nulls & 2 else c1)


def _decode_step_binary(engine: str, payload: bytes) -> StepRecord:
    end = 1 + STEP_HEAD.size
    if len(payload) < end:
        raise CodecError("short step record")
    extras: dict[str, Any] | None = None
    if len(payload) > end:
        try:
            extras = json.loads(payload[end:])
        except ValueError as exc:
            raise CodecError(f"bad step extras: {exc}") from exc
        if not isinstance(extras, dict):
            raise CodecError("step extras are not an object")
    return _step_of(engine, STEP_HEAD.unpack_from(payload, 1), extras)


_SPLITS: dict[tuple[int, int], dict[str, int]] = {}
_MAX_SPLITS = 4096
_NO_CONNECTOR: dict[str, Any] = {}
_NO_FINISHED: list[dict[str, Any]] = []
_NO_DETAILS: dict[str, Any] = {}
_NO_WAITING: dict[str, int] = {}


def _step_of(engine: str, head: tuple[Any, ...], extras: dict[str, Any] | None) -> StepRecord:
    """A step record from an S record's fixed fields and its extras (None: it had none)."""
    (step, ts, engine_index, running, waiting, deferred, kv, preempt, prompt, gen, finished, pq, ph) = head
    if extras is None:
        # A plain step shares its containers with every other plain step: the same empty ones,
        # and one waiting split per (capacity, deferred) seen. A ring of 8 x 4,096 steps held
        # ~650 bytes a step, most of it four containers of its own. Nothing mutates a held
        # step's containers (ingest replaces, never edits them).
        split = (max(waiting - deferred, 0), deferred)
        by_reason = _SPLITS.get(split)
        if by_reason is None:
            if len(_SPLITS) >= _MAX_SPLITS:
                _SPLITS.clear()
            by_reason = _SPLITS[split] = {"capacity": split[0], "deferred": deferred}
        return StepRecord(
            engine=engine,
            ts=ts,
            step=step,
            running=running,
            waiting=waiting,
            kv_cache_usage=kv,
            preemptions=preempt,
            prompt_tokens=prompt,
            generation_tokens=gen,
            finished=finished,
            waiting_by_reason=by_reason,
            prefix_cache_queries=pq,
            prefix_cache_hits=ph,
            connector=_NO_CONNECTOR,
            finished_requests=_NO_FINISHED,
            details=_NO_DETAILS,
            engine_index=engine_index,
            halves=HALF_STATS,
        )
    unknown = extras.get("null")
    if isinstance(unknown, list) and unknown:
        nulls = {name for name in unknown if name in _NULL_NAMES}
        running, waiting_v, kv, preempt, prompt, gen, finished, pq, ph = (
            None if name in nulls else v
            for name, v in zip(_NULLABLE_FIXED, (running, waiting, kv, preempt, prompt, gen, finished, pq, ph), strict=True)
        )
    else:
        waiting_v = waiting
    by_reason = {"capacity": max(waiting - deferred, 0), "deferred": deferred}
    more = extras.get("waiting_by_reason")
    if isinstance(more, dict):
        by_reason.update(more)
    connector = extras.get("connector")
    worker = extras.get("worker")
    details = {k: v for k in STEP_DETAIL_KEYS if isinstance(v := extras.get(k), dict)}
    return StepRecord(
        engine=engine,
        ts=ts,
        step=step,
        running=running,
        waiting=waiting_v,
        kv_cache_usage=kv,
        preemptions=preempt,
        prompt_tokens=prompt,
        generation_tokens=gen,
        finished=finished,
        waiting_by_reason=by_reason,
        prefix_cache_queries=pq,
        prefix_cache_hits=ph,
        connector=connector if isinstance(connector, dict) else {},
        engine_index=engine_index,
        worker=worker if isinstance(worker, str) else None,
        halves=HALF_STATS,
        details=details,
    )


# fixed fields of an S record a recorder may name as unread (``"null"`` in its extras)
_NULL_NAMES = frozenset(_NULLABLE_STEP_FIELDS) - {"deferred"}
_NULLABLE_FIXED = tuple(name for name in _NULLABLE_STEP_FIELDS if name != "deferred")


_block_type: type[RequestBlock] | None = None
_records: type[RequestRecords] | None = None


def _records_type() -> type[RequestRecords]:
    global _block_type, _records  # noqa: PLW0603 - imported once, on first use (blocks imports this module)
    if _records is None:
        from collector.channel.blocks import RequestBlock, RequestRecords  # noqa: PLC0415

        _block_type, _records = RequestBlock, RequestRecords
    return _records


def _decode_request_block(engine: str, payload: bytes | memoryview, requests: RequestRecords | None = None) -> StepRecord:
    """An ``R`` record as a step half holding the record's bytes: no row objects. A record that
    keeps an earlier record's running set needs ``requests``, the ring's decoder."""
    _records_type()
    assert _block_type is not None
    if requests is None:
        block = _block_type.from_payload(payload)
    else:
        got = requests.block(payload)
        if got is None:
            raise CodecError("request record keeps the running set of an earlier record, which this reader has not read")
        block = got
    # the shared empty containers, as a plain step's (``_step_of``): four fresh ones a step
    # that nothing fills (a held step's containers are replaced, never edited)
    return StepRecord(
        engine=engine,
        ts=block.ts,
        step=block.step,
        running=block.running,
        waiting_by_reason=_NO_WAITING,
        connector=_NO_CONNECTOR,
        finished_requests=_NO_FINISHED,
        details=_NO_DETAILS,
        request_block=block,
        halves=HALF_REQUESTS,
    )


def _decode_event(engine: str, body: dict[str, Any]) -> Event:
    # Each field typed as its column: a string xid or a float pid made /api/v1/events answer 500.
    return Event(
        kind=EventKind(f.text(body, "kind")),
        ts=f.timestamp(body),
        source=f.optional_text(body, "source", limit=64) or "recorder",
        message=f.text(body, "message", default=""),
        severity=Severity(f.text(body, "severity", default="warning")),
        engine=engine,
        gpu=f.optional_text(body, "gpu"),
        xid=f.optional_integer(body, "xid"),
        pid=f.optional_integer(body, "pid"),
        process=f.optional_text(body, "process"),
        frames=f.sequence(body, "frames", dict),
        lines=f.sequence(body, "lines", str),
        data=f.mapping(body, "data"),
    )
