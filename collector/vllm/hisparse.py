"""Per-request HiSparse state, read where vLLM keeps it (vllm/v1/hisparse/, vllm 0.32 and 0.33).

- **Mirror rows** are not a ``Request`` attribute. Each step the HiSparse connector's scheduler
  side builds ``HiSparseConnectorMetadata.row_mirrors``: request id -> tuple of
  ``SparseKVRowMirror(source_starts, destination_start, num_rows)``; it reaches the step as
  ``SchedulerOutput.kv_connector_metadata`` (inside ``MultiKVConnectorMetadata.metadata`` under
  MultiConnector). A request's rows this step are the sum of ``num_rows``; a running request
  without an entry was not scheduled and mirrors 0 rows. The span includes the draft lookahead,
  so it bounds from above what the worker copies. It is per-step copy work, not rows held.
- **Host blocks** a request holds are in the HiSparse coordinator
  (``connector_scheduler.coordinator.host_manager.req_to_blocks``, a defaultdict: read with
  ``.get``, never ``[...]``, which would insert), null blocks skipped.

These are vLLM internals: every attribute is read defensively, and what cannot be read is -1
(unknown) in the ``R`` record, never 0.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

HISPARSE = "HiSparseConnector"
_NUM_ROWS = attrgetter("num_rows")
_IS_NULL = attrgetter("is_null")
_NONE: tuple[Any, ...] = ()


def _class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def find_hisparse(connector: Any) -> Any:
    """The HiSparseConnector of a scheduler's connector (itself, or among MultiConnector's
    ``sub_connectors``), or None."""
    if connector is None:
        return None
    if HISPARSE in _class_names(connector):
        return connector
    subs = getattr(connector, "sub_connectors", None)
    if subs is None:
        subs = getattr(connector, "_connectors", None)
    for sub in subs or ():
        if HISPARSE in _class_names(sub):
            return sub
    return None


def row_mirrors_of(metadata: Any) -> Mapping[str, Sequence[Any]] | None:
    """``row_mirrors`` of the HiSparse metadata in a step's ``kv_connector_metadata``, or None
    when the step carries none."""
    if metadata is None:
        return None
    rows = getattr(metadata, "row_mirrors", None)
    if isinstance(rows, Mapping):
        return rows
    for sub in getattr(metadata, "metadata", None) or ():  # MultiKVConnectorMetadata
        rows = getattr(sub, "row_mirrors", None)
        if isinstance(rows, Mapping):
            return rows
    return None


def mirror_rows_column(ids: Sequence[str], row_mirrors: Mapping[str, Sequence[Any]] | None) -> bytes:
    """One i32 per request: rows mirrored this step; all -1 when the step had no metadata."""
    if row_mirrors is None:
        return array("i", [-1]).tobytes() * len(ids)
    # sum(num_rows) per request, every loop in C: map(map, ...) yields one map of num_rows per
    # request's mirrors, map(sum, ...) adds each up
    spans = map(row_mirrors.get, ids, repeat(_NONE))
    return array("i", map(sum, map(map, repeat(_NUM_ROWS), spans))).tobytes()


class HostBlocks:
    """Counts the host blocks the coordinator holds per request.

    The host group is a ``HiSparseSourceManager``, a full-attention manager: a request's block
    list only grows (or is freed whole), so a request's count is redone only when its list's
    length changed. A step reads every length in C (``map(len, ...)``) and, when no length and
    no request changed, which is most decode steps (a block holds 64 tokens), reuses the last
    column as it is.
    """

    def __init__(self, hisparse: Any) -> None:
        self.hisparse = hisparse
        self._ids: Sequence[str] | None = None
        self._lens = array("i")
        self._column = b""

    def _req_to_blocks(self) -> Mapping[str, Sequence[Any]] | None:
        sched = getattr(self.hisparse, "connector_scheduler", None)
        coordinator = getattr(sched, "coordinator", None)
        manager = getattr(coordinator, "host_manager", None)
        blocks = getattr(manager, "req_to_blocks", None)
        return blocks if isinstance(blocks, Mapping) else None

    def column(self, ids: Sequence[str]) -> bytes:
        req_to_blocks = self._req_to_blocks()
        if req_to_blocks is None:  # no coordinator bound (yet): unknown
            return array("i", [-1]).tobytes() * len(ids)
        lists = list(map(req_to_blocks.get, ids, repeat(_NONE)))  # .get: never inserts
        lens = array("i", map(len, lists))
        if lens == self._lens and ids is self._ids:
            return self._column
        old = self._lens if ids is self._ids else None
        counts = array("i", self._column) if old is not None else array("i", bytes(4 * len(ids)))
        for i, blocks in enumerate(lists):
            if old is None or old[i] != lens[i]:
                counts[i] = lens[i] - sum(map(_IS_NULL, blocks))  # a request without blocks: 0
        self._ids, self._lens, self._column = ids, lens, counts.tobytes()
        return self._column
