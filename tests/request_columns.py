"""Per-request rows for tests, built the way the recorder writes them: a test names its rows
(``Row``) and gets the ``R`` record's bytes (``encode_rows``), the block ingest holds (``make_block``) or a
step carrying that block (``with_rows``); ``rows_of`` reads a record or a block back as rows.

The package has no row objects: its hot path writes columns (``RequestRecorder.write_requests``,
``encode_request_columns``) and holds ``RequestBlock``s. This is the one place tests turn rows
into those columns.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from collector.channel.blocks import RequestBlock, decode_columns
from collector.channel.codec import encode_request_columns
from collector.model import HALF_REQUESTS, StepRecord, StepRequests
from collector.recorder import status_code


@dataclass(frozen=True, slots=True)
class Row:
    """One running request at one step; None: not known (the column's -1)."""

    request_id: str
    prompt_len: int
    computed_tokens: int
    output_tokens: int = 0
    preemptions: int = 0
    status: str = "running"
    mirror_rows: int | None = None
    host_blocks: int | None = None


def _optional(rows: Sequence[Row], name: str) -> bytes | None:
    """An optional column: left out when no row knows it, as a recorder without it writes."""
    values = [getattr(r, name) for r in rows]
    if all(v is None for v in values):
        return None
    return array("i", [-1 if v is None else v for v in values]).tobytes()


def encode_rows(step: int, ts: float, rows: Sequence[Row]) -> bytes:
    """The ``R`` record of ``rows``."""

    def col(name: str) -> bytes:
        return array("I", [getattr(r, name) for r in rows]).tobytes()

    return encode_request_columns(
        step,
        ts,
        len(rows),
        "\0".join(r.request_id for r in rows).encode(),
        col("prompt_len"),
        col("computed_tokens"),
        col("output_tokens"),
        col("preemptions"),
        bytes(status_code(r.status) for r in rows),
        _optional(rows, "mirror_rows"),
        _optional(rows, "host_blocks"),
    )


def make_block(step: int, ts: float, rows: Sequence[Row], prev: StepRequests | None = None) -> RequestBlock:
    """The block ingest holds for ``rows`` (``prev``: the engine's block before, whose ids it shares)."""
    return RequestBlock.from_payload(encode_rows(step, ts, rows), prev)


def with_rows(rec: StepRecord, rows: Sequence[Row]) -> StepRecord:
    """``rec`` carrying the scheduler's half too: its block of ``rows`` (a step's ``running`` is
    the stats half's when it has one, else the rows running)."""
    b = make_block(rec.step, rec.ts, rows)
    running = rec.running if rec.running is not None else b.running
    return dataclasses.replace(rec, request_block=b, halves=rec.halves | HALF_REQUESTS, running=running)


def rows_of(source: bytes | StepRequests | None) -> list[Row]:
    """The rows of an ``R`` record or a block (none for None)."""
    if source is None:
        return []
    b = RequestBlock.from_payload(source) if isinstance(source, bytes) else source
    cols = decode_columns([b])
    return [
        Row(
            request_id=cols["request_id"][i],
            prompt_len=cols["prompt_len"][i],
            computed_tokens=cols["computed_tokens"][i],
            output_tokens=cols["output_tokens"][i],
            preemptions=cols["preemptions"][i],
            status=cols["status"][i],
            mirror_rows=cols["mirror_rows"][i],
            host_blocks=cols["host_blocks"][i],
        )
        for i in range(len(cols["request_id"]))
    ]
