"""A ring read decoded as columns (sidecar only: numpy).

The ``S`` records without extras (most steps) of one read become ``STATS_DTYPE`` rows with one
structured ``frombuffer`` over their joined bytes; an ``S`` record with JSON extras is decoded
alone (``codec``) and its row and extras join them. ``R`` records become request blocks (the
recorder's own bytes). Every other record (meta, the workload, events, fingerprints, and the
errors of records that are not ours) comes back as ``codec.decode_many`` gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from collector.channel.blocks import RequestBlock
from collector.channel.codec import STEP_HEAD, TAG_REQS, TAG_STEP, CodecError, Decoded, decode_many
from collector.columns import INT64_NULL, INT_NULL, STATS_DTYPE, stats_of_records
from collector.model import StepExtra, StepRecord, StepRequests

__all__ = ["Read", "decode_read"]

# An ``S`` record as written: the tag, then ``STEP_HEAD`` (little endian, packed).
WIRE_DTYPE = np.dtype(
    [
        ("tag", "u1"),
        ("step", "<u8"),
        ("ts", "<f8"),
        ("engine_index", "<u2"),
        ("running", "<u4"),
        ("waiting", "<u4"),
        ("deferred", "<u4"),
        ("kv_cache_usage", "<f8"),
        ("preemptions", "<u4"),
        ("prompt_tokens", "<u4"),
        ("generation_tokens", "<u4"),
        ("finished", "<u4"),
        ("prefix_cache_queries", "<u8"),
        ("prefix_cache_hits", "<u8"),
    ]
)
assert WIRE_DTYPE.itemsize == 1 + STEP_HEAD.size
_PLAIN = WIRE_DTYPE.itemsize
_STEP, _REQS = TAG_STEP[0], TAG_REQS[0]
_U32_FIELDS = ("running", "waiting", "deferred", "preemptions", "prompt_tokens", "generation_tokens", "finished")
_STEP_MAX = (1 << 62) - 1


@dataclass
class Read:
    """One read's records: the step halves as columns, the rest as ``codec.decode_many`` gives
    them (in order)."""

    stats: npt.NDArray[np.void] | None = None
    extras: dict[int, StepExtra] = field(default_factory=dict)
    blocks: list[StepRequests] = field(default_factory=list)
    other: list[Decoded] = field(default_factory=list)
    bad_steps: int = 0  # S records whose step number is out of range (set aside, counted)


def decode_read(payloads: Sequence[bytes | memoryview], *, engine: str | None = None) -> Read:
    out = Read()
    plain: list[bytes | memoryview] = []
    rich: list[StepRecord] = []  # S records with extras, decoded alone
    rest: list[bytes | memoryview] = []
    prev: StepRequests | None = None
    for p in payloads:
        tag = p[0] if len(p) else -1
        if tag == _STEP:
            if len(p) == _PLAIN:
                plain.append(p)
                continue
            try:
                _, obs = _decode_one(p, engine)
            except CodecError as exc:
                out.other.append((None, None, exc))
                continue
            if isinstance(obs, StepRecord):
                rich.append(obs)
            continue
        if tag == _REQS:
            try:
                block = RequestBlock.from_payload(p, prev)
            except CodecError as exc:
                out.other.append((None, None, exc))
                continue
            out.blocks.append(block)
            prev = block
            continue
        rest.append(p)
    if rest:
        out.other = out.other + decode_many(rest, engine=engine)
    parts = []
    if plain:
        parts.append(_plain_rows(np.frombuffer(b"".join(plain), dtype=WIRE_DTYPE)))
    if rich:
        rows, extras = stats_of_records(rich)
        base = sum(len(x) for x in parts)
        out.extras = {base + i: ex for i, ex in extras.items()}
        parts.append(rows)
    if parts:
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        ok = (rows["step"] >= 0) & (rows["step"] <= _STEP_MAX)
        if not ok.all():
            out.bad_steps = int((~ok).sum())
            keep = np.flatnonzero(ok)
            out.extras = {int(np.searchsorted(keep, i)): ex for i, ex in out.extras.items() if ok[i]}
            rows = rows[ok]
        out.stats = rows if len(rows) else None
    return out


def _decode_one(payload: bytes | memoryview, engine: str | None) -> tuple[object, object]:
    from collector.channel.codec import decode  # noqa: PLC0415 - the slow path

    return decode(bytes(payload), engine=engine)


def _plain_rows(wire: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    rows = np.empty(len(wire), dtype=STATS_DTYPE)
    step = wire["step"]
    rows["step"] = np.where(step > _STEP_MAX, -1, step.astype(np.int64))  # out of range: set aside
    rows["ts"] = wire["ts"]
    rows["engine_index"] = wire["engine_index"]
    for name in _U32_FIELDS:
        col = wire[name]
        rows[name] = np.minimum(col, 0x7FFFFFFF).astype(np.int32)
    rows["kv_cache_usage"] = wire["kv_cache_usage"]
    for name in ("prefix_cache_queries", "prefix_cache_hits"):
        rows[name] = np.minimum(wire[name], (1 << 63) - 1).astype(np.int64)
    return rows


# (kept for the reader's sake: what a null slot holds in the rows)
NULLS = {"int32": INT_NULL, "int64": INT64_NULL}
