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
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["INT_NULL", "STEP_COLUMNS", "STEP_DTYPE", "StepBatch", "to_python"]

INT_NULL = int(np.iinfo(np.int32).min)  # an int32 figure nobody measured

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
        """Rows as ``STEP_COLUMNS`` tuples with None for unknown (the driver's form)."""
        return [tuple(to_python(v) for v in row) for row in self.cols.tolist()]


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
