"""Internal: Steps as columns: the form in which a batch of one engine's steps passes from ingest to
storage (and, inside ingest, the form its step window keeps).

A batch is one engine's merged steps (both halves where both came) in step order, as a numpy
structured array of ``STEP_DTYPE``: one C-level array per batch instead of one Python object
per step. Unknown is not zero: an integer figure no half carried is ``INT_NULL``, a float one
is NaN; ``to_python`` turns both into None.

Sidecar only: the engine-side recorder never imports numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from collector.model import StepExtra, StepRecord

__all__ = ["INT64_NULL", "INT_NULL", "STATS_DTYPE", "STEP_COLUMNS", "STEP_DTYPE", "StepBatch", "stats_of_records", "to_python"]

INT_NULL = int(np.iinfo(np.int32).min)  # an int32 figure nobody measured
INT64_NULL = int(np.iinfo(np.int64).min)  # an int64 one

# The stored step's figures, in ``engine_steps``' order (collector.storage.models.EngineStepRow).
STEP_DTYPE = np.dtype(
    [
        ("ts", "<f8"),
        ("step", "<i8"),
        ("run", "<i8"),
        ("running", "<i4"),
        ("waiting", "<i4"),
        ("kv_cache_usage", "<f8"),
        ("preemptions", "<i4"),
        ("prompt_tokens", "<i4"),
        ("generation_tokens", "<i4"),
        ("mirror_rows", "<i4"),
        ("host_blocks", "<i4"),
    ]
)
STEP_COLUMNS: tuple[str, ...] = tuple(STEP_DTYPE.names or ())


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One engine's merged steps, in step order (``cols`` is owned by the batch: never changed
    after it is built)."""

    engine: str
    cols: npt.NDArray[np.void]

    def __len__(self) -> int:
        return len(self.cols)

    def tuples(self) -> list[tuple[Any, ...]]:
        """Rows as ``STEP_COLUMNS`` tuples with None for unknown (the driver's form): a column
        at a time (Python ints and floats, None where unknown), then zipped."""
        out: list[list[Any]] = []
        for name in STEP_COLUMNS:
            col = self.cols[name]
            unknown = np.isnan(col) if col.dtype.kind == "f" else col == INT_NULL
            values = col.astype(object)
            if unknown.any():
                values[unknown] = None
            out.append(values.tolist())
        return list(zip(*out, strict=True))


def to_python(value: Any) -> Any:
    """A column value as the database and the API take it: ``INT_NULL`` and NaN are None."""
    if value is None:
        return None
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, int):
        return None if value == INT_NULL else value
    return value


def batch_from_rows(engine: str, rows: list[dict[str, Any]]) -> StepBatch:
    """A batch from rows of ``STEP_COLUMNS`` (None for unknown): for tests and slow paths."""
    cols = np.empty(len(rows), dtype=STEP_DTYPE)
    for name in STEP_COLUMNS:
        null: Any = math.nan if STEP_DTYPE[name].kind == "f" else INT_NULL
        cols[name] = [null if r.get(name) is None else r[name] for r in rows]
    return StepBatch(engine, cols)


# One stats half per row, as ``collector.channel.reads`` decodes a read's ``S`` records (nulls
# already applied: ``INT_NULL`` / NaN).
STATS_DTYPE = np.dtype(
    [
        ("step", "<i8"),
        ("ts", "<f8"),
        ("engine_index", "<i4"),
        ("running", "<i4"),
        ("waiting", "<i4"),
        ("deferred", "<i4"),
        ("kv_cache_usage", "<f8"),
        ("preemptions", "<i4"),
        ("prompt_tokens", "<i4"),
        ("generation_tokens", "<i4"),
        ("finished", "<i4"),
        ("prefix_cache_queries", "<i8"),
        ("prefix_cache_hits", "<i8"),
    ]
)
_INT_STATS = ("running", "waiting", "preemptions", "prompt_tokens", "generation_tokens", "finished")
_I64_STATS = ("prefix_cache_queries", "prefix_cache_hits")
_NO_CONNECTOR: dict[str, Any] = {}
_NO_DETAILS: dict[str, Any] = {}


def _clip(v: Any, null: int, top: int) -> int:
    """A record's figure as a column value: None is ``null``; one the column cannot hold (not a
    number, beyond it) raises ``ValueError``."""
    if v is None:
        return null
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or not -top <= v <= top:
        raise ValueError(f"step figure {v!r} does not fit its column")
    return int(v)


def stats_of_records(recs: Sequence[StepRecord]) -> tuple[npt.NDArray[np.void], dict[int, StepExtra]]:
    """Records' stats halves as ``STATS_DTYPE`` rows and their extras (the slow path: tests,
    the simulator, JSON steps). A figure its column cannot hold raises ``ValueError``."""
    rows = np.zeros(len(recs), dtype=STATS_DTYPE)
    extras: dict[int, StepExtra] = {}
    top32, top64 = 0x7FFFFFFF, (1 << 63) - 1
    for i, r in enumerate(recs):
        row = rows[i : i + 1]
        row["step"] = r.step
        row["ts"] = r.ts
        row["engine_index"] = _clip(r.engine_index, 0, top32)
        for name in _INT_STATS:
            row[name] = _clip(getattr(r, name), INT_NULL, top32)
        for name in _I64_STATS:
            row[name] = _clip(getattr(r, name), INT64_NULL, top64)
        kv = r.kv_cache_usage
        row["kv_cache_usage"] = np.nan if kv is None else float(kv)
        wbr = r.waiting_by_reason
        deferred, by_reason = INT_NULL, None
        if wbr:
            d = wbr.get("deferred")
            if (
                set(wbr) == {"capacity", "deferred"}
                and type(d) is int
                and 0 <= d <= top32
                and r.waiting is not None
                and wbr["capacity"] == max(r.waiting - d, 0)
            ):
                deferred = d
            else:
                by_reason = dict(wbr)
        row["deferred"] = deferred
        if by_reason is not None or r.connector or r.worker is not None or r.details:
            extras[i] = StepExtra(
                waiting_by_reason=by_reason, connector=r.connector or _NO_CONNECTOR, worker=r.worker, details=r.details or _NO_DETAILS
            )
    return rows, extras
