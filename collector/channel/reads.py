"""Internal: a ring read decoded as columns (sidecar only: numpy).

The ``S`` records without extras (most steps) of one read become ``STATS_DTYPE`` rows with one
structured ``frombuffer`` over their joined bytes; an ``S`` record with JSON extras is decoded
alone (``codec``) and its row and extras join them. ``R`` records become request blocks (the
recorder's own bytes). Every other record (meta, the workload, events, fingerprints, and the
errors of records that are not ours) comes back as ``codec.decode_many`` gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from collector.channel.blocks import RequestRecords
from collector.channel.codec import STEP_HEAD, TAG_REQS, TAG_STEP, TAG_WORK, CodecError, Decoded, decode_many
from collector.channel.ringfile import RingRecords
from collector.channel.work_columns import WorkColumns, decode_work_records
from collector.columns import STATS_DTYPE, stats_of_records
from collector.model import StepExtra, StepRecord, StepRequests, WorkloadBatch

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
# the same records without their tag: their fields in ``STATS_DTYPE``'s order
_TAIL = list(WIRE_DTYPE.names or ())[1:]
_WIRE_FIELDS: np.dtype[np.void] = np.dtype(  # type: ignore[call-overload]
    {
        "names": _TAIL,
        "formats": [WIRE_DTYPE[n] for n in _TAIL],
        "offsets": [WIRE_DTYPE.fields[n][1] for n in _TAIL],  # type: ignore[index]
        "itemsize": WIRE_DTYPE.itemsize,
    }
)
assert tuple(_WIRE_FIELDS.names or ()) == tuple(STATS_DTYPE.names or ())
_PLAIN = WIRE_DTYPE.itemsize
_STEP, _REQS, _WORK = TAG_STEP[0], TAG_REQS[0], TAG_WORK[0]
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


def decode_read(
    payloads: Sequence[bytes | memoryview],
    *,
    engine: str | None = None,
    records: Callable[[], RingRecords | None] | None = None,
    places: Sequence[int] | None = None,
    requests: RequestRecords | None = None,
) -> Read:
    """``records`` (the ring's, asked for at the first ``R`` record; None: copy them) and
    ``places`` (each payload's logical offset in it): the ``R`` records are kept as their place
    in the ring, not copied (``RequestBlock.in_ring``). ``requests``: the ring's ``R`` decoder,
    which holds its running set from one read to the next (None: a new one, for a read of a
    whole ring); given ``places``, it sees a break in the ring's records by them."""
    out = Read()
    ring: RingRecords | None = None
    left = records is not None and places is not None and len(places) == len(payloads)
    plain: list[bytes | memoryview] = []
    rich: list[StepRecord] = []  # S records with extras, decoded alone
    rest: list[bytes | memoryview] = []
    work: list[bytes | memoryview] = []  # W records: one batch, at the place of the first among the rest
    work_at = -1
    if requests is None:
        requests = RequestRecords()
    # a break in the ring's records drops the running set held, before the record after it
    breaks = requests.breaks(places, payloads) if places is not None and len(places) == len(payloads) else []
    next_break = breaks.pop(0) if breaks else -1
    for i, p in enumerate(payloads):
        if i == next_break:
            requests.reset()
            next_break = breaks.pop(0) if breaks else -1
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
            if left and ring is None:
                ring = records()  # type: ignore[misc]
                left = ring is not None
            try:
                block = requests.block(p, ring, places[i]) if left else requests.block(p)  # type: ignore[index]
            except CodecError as exc:
                out.other.append((None, None, exc))
                continue
            if block is not None:  # (None: it kept a running set this reader has not read)
                out.blocks.append(block)
            continue
        if tag == _WORK:
            if work_at < 0:
                work_at = len(rest)
            work.append(p)
            continue
        rest.append(p)
    requests.read_done()
    if rest:
        out.other = out.other + decode_many(rest, engine=engine)
    if work:  # the batch goes where its first record stood among the others
        at = len(out.other) - len(rest) + work_at
        out.other[at:at] = _work_batch(work, engine)
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


def _work_batch(payloads: list[bytes | memoryview], engine: str | None) -> list[Decoded]:
    """The read's ``W`` records as one ``WorkloadBatch`` (columns: ``work_columns``), then the
    errors of any refused."""
    records, errors = decode_work_records(payloads)
    out: list[Decoded] = []
    if records:
        ts = float(records.ts.max()) if isinstance(records, WorkColumns) else max(r.ts for r in records)
        out.append((None, WorkloadBatch(engine=engine or "unknown", ts=ts, records=records), None))
    out.extend((None, None, exc) for exc in errors)
    return out


def _decode_one(payload: bytes | memoryview, engine: str | None) -> tuple[object, object]:
    from collector.channel.codec import decode  # noqa: PLC0415 - the slow path

    return decode(bytes(payload), engine=engine)


def _plain_rows(wire: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """The ``S`` records' fixed fields as ``STATS_DTYPE`` rows, in one cast (field by field, in
    order: a step beyond 2^62 becomes negative and is set aside by the caller; a count beyond
    2^31 wraps, as no column could hold it)."""
    rows: npt.NDArray[np.void] = wire.view(_WIRE_FIELDS).astype(STATS_DTYPE)
    return rows
