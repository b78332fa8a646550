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
from operator import attrgetter
from typing import Any

HISPARSE = "HiSparseConnector"
_NUM_ROWS = attrgetter("num_rows")
_IS_NULL = attrgetter("is_null")


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
    get = row_mirrors.get
    return array("i", [sum(map(_NUM_ROWS, get(rid, ()))) for rid in ids]).tobytes()


class HostBlocks:
    """Counts the host blocks the coordinator holds per request.

    The host group is a ``HiSparseSourceManager``, a full-attention manager: a request's block
    list only grows (or is freed whole), so a count is redone only when the list's length
    changed; a step costs one ``.get`` and one ``len`` per request.
    """

    def __init__(self, hisparse: Any) -> None:
        self.hisparse = hisparse
        self._counts: dict[str, tuple[int, int]] = {}

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
        counts = self._counts
        if len(counts) > 4 * len(ids) + 64:  # finished requests: forget them
            keep = set(ids)
            self._counts = counts = {k: v for k, v in counts.items() if k in keep}
        get = req_to_blocks.get
        out = array("i")
        for rid in ids:
            blocks = get(rid)
            if not blocks:
                out.append(0)  # the coordinator holds no host block for it
                continue
            n = len(blocks)
            known = counts.get(rid)
            if known is None or known[0] != n:
                known = (n, n - sum(map(_IS_NULL, blocks)))
                counts[rid] = known
            out.append(known[1])
        return out.tobytes()
