"""Per-step request columns, built when a step's rows arrive, so freezing a full ring costs
list concatenations instead of a quarter-million attribute reads and JSON encodes.

A snapshot's per-request part is columnar (``snapshot_doc.RequestTable``). At 4,096 steps x 64
requests, building those columns at fault time and JSON-encoding them took ~0.4 s of the 0.5 s
fault-to-durable-snapshot budget; ~0.16 s now (``bench/bench_freeze.py``). Here each step's columns
are read once on arrival (``map`` over ``attrgetter``: C loops) and each column is JSON-encoded
once; a column equal to the previous step's (ids, prompt lengths, statuses stay the same while
the running set does) reuses its text. Steady-state cost: ~10-30 us per step at 64 requests.
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any

from collector.model import RequestRow

# the order of snapshot_doc.REQUEST_COLUMNS, without "step"
COLUMNS = ("request_id", "prompt_len", "computed_tokens", "output_tokens", "preemptions", "status", "mirror_rows")
_GET = {c: attrgetter(c) for c in COLUMNS}
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


class StepColumns:
    """One step's request rows as columns, with each column's JSON text (no brackets)."""

    __slots__ = ("step", "n", "cols", "text", "has_extras")

    def __init__(self, step: int, rows: list[RequestRow], prev: StepColumns | None = None) -> None:
        self.step = step
        self.n = len(rows)
        self.cols: dict[str, list[Any]] = {c: list(map(_GET[c], rows)) for c in COLUMNS}
        self.has_extras = any(r.extras for r in rows)
        text: dict[str, str] = {}
        for c, col in self.cols.items():
            if prev is not None and prev.cols[c] == col:
                text[c] = prev.text[c]
            else:
                text[c] = _encode(col)[1:-1]
        text["step"] = ",".join([str(step)] * self.n)
        self.text = text


def columns_json(chunks: list[StepColumns]) -> bytes:
    """The JSON of ``RequestTable.to_json()`` for these steps, spliced from the cached texts."""
    live = [ch for ch in chunks if ch.n]
    parts = []
    for name in ("step", *COLUMNS):
        parts.append(f'"{name}":[' + ",".join(ch.text[name] for ch in live) + "]")
    return ('{"columns":{' + ",".join(parts) + '},"sparse":[]}').encode()
