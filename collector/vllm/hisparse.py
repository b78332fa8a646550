"""Internal: per-request HiSparse state, read where vLLM keeps it (vllm/v1/hisparse/, vllm 0.32 and 0.33).

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

import struct
from array import array
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, ne
from typing import Any

HISPARSE = "HiSparseConnector"
_NUM_ROWS = attrgetter("num_rows")
_IS_NULL = attrgetter("is_null")
_NONE: tuple[Any, ...] = ()
_MINUS_ONE = array("i", [-1]).tobytes()


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
    if type(rows) is dict or isinstance(rows, Mapping):  # a dict in vLLM: no ABC check per step
        return rows
    for sub in getattr(metadata, "metadata", None) or ():  # MultiKVConnectorMetadata
        rows = getattr(sub, "row_mirrors", None)
        if type(rows) is dict or isinstance(rows, Mapping):
            return rows
    return None


def _rows_uniform(spans: Sequence[Sequence[Any]], width: int) -> list[int]:
    """Each request's rows when every request has ``width`` (1 or 2) mirrors: one comprehension
    whose tuple unpacking checks the width (a request with another count raises ValueError)."""
    if width == 1:
        return [a.num_rows for (a,) in spans]
    return [a.num_rows + b.num_rows for a, b in spans]


def _rows_any(spans: Sequence[Sequence[Any]]) -> list[int]:
    """Each request's rows, whatever the count of its mirrors (none: 0)."""
    return [s[0].num_rows if len(s) == 1 else sum(map(_NUM_ROWS, s)) for s in spans]


def _unknown(n: int) -> bytes:
    return _MINUS_ONE * n


_I32: dict[int, struct.Struct] = {}


def i32_column(values: Sequence[int]) -> bytes:
    """The bytes of ``array("i", values)``, built by a ``struct.Struct`` of that many items,
    which packs a list of ints in about half the time ``array("i", ...)`` takes (the ``"i"`` code
    parses each item through ``PyArg_Parse``); an out-of-range value raises as there."""
    n = len(values)
    packer = _I32.get(n)
    if packer is None:
        if len(_I32) >= 64:
            _I32.clear()
        packer = _I32[n] = struct.Struct(f"<{n}i")
    return packer.pack(*values)


class MirrorRows:
    """The mirror-rows column, one i32 per running request: the rows HiSparse mirrors for it this
    step (the sum of its ``SparseKVRowMirror.num_rows``); all -1 when the step has no metadata.

    ``row_mirrors`` is a new dict of new tuples every step (``build_connector_meta``,
    vllm/distributed/kv_transfer/kv_connector/v1/hisparse/connector.py:171-190 in vLLM 0.32), so
    nothing of it can be kept across steps; what is kept is its shape. Its keys follow
    ``num_scheduled_tokens``, which ``Scheduler.schedule`` fills in the order of ``running``: when
    every running request was scheduled, the keys are the running ids in order and the values are
    read as they are, else each request's entry is looked up (absent: not scheduled, 0 rows). A
    decode step gives every request the same number of spans (one, or two when the span crosses
    a page): that width, remembered from the last step, is read by one comprehension; another
    shape falls back to a per-request sum. A mirror's ``num_rows`` is read as an attribute, the
    one read per mirror that cannot be avoided.
    """

    def __init__(self) -> None:
        self._width = 1

    def column(self, ids: Sequence[str], row_mirrors: Mapping[str, Sequence[Any]] | None) -> bytes:
        if row_mirrors is None:
            return _unknown(len(ids))
        if len(row_mirrors) == len(ids) and list(row_mirrors) == ids:
            spans: Sequence[Sequence[Any]] = list(row_mirrors.values())
        else:
            spans = list(map(row_mirrors.get, ids, repeat(_NONE)))
        try:
            rows = _rows_uniform(spans, self._width)
        except ValueError:  # not every request has that many spans this step
            lens = set(map(len, spans))
            width = lens.pop() if len(lens) == 1 else 0
            if width in (1, 2):
                self._width = width
                rows = _rows_uniform(spans, width)
            else:
                rows = _rows_any(spans)
        return i32_column(rows)


def mirror_rows_column(ids: Sequence[str], row_mirrors: Mapping[str, Sequence[Any]] | None) -> bytes:
    """One i32 per request: rows mirrored this step; all -1 when the step had no metadata (a
    one-off ``MirrorRows().column``)."""
    return MirrorRows().column(ids, row_mirrors)


class HostBlocks:
    """Counts the host blocks the coordinator holds per running request, kept across steps.

    Where they live: ``host_manager.req_to_blocks``, a defaultdict of one list per request
    (vllm/v1/core/single_type_kv_cache_manager.py:125 in vLLM 0.32). How that list changes, and
    why reading its length is enough:

    - it is created on a request's first allocation and removed whole, by ``pop``, when the
      request is freed (:576, the only removal); a freed request leaves ``running`` (finished or
      preempted), so a list held for an unchanged running set is the request's live list;
    - while it lives it only grows (``append``/``extend`` in ``allocate_new_blocks`` and
      ``add_local_computed_blocks``, :311), or has a block swapped for its copy-on-write copy
      (:472), a real block for a real one;
    - a block is turned into the null block in place only by ``remove_skipped_blocks`` (:668), a
      no-op for the host group: ``HiSparseSourceManager`` (:2200) is a ``FullAttentionManager``,
      whose ``get_num_skipped_tokens`` is 0 (:712-723).

    So the count is kept per request and a step reads only the lists' lengths (``map(len, ...)``
    over the lists held since the running set last changed). When no length moved, which is most
    decode steps (a block holds 64 tokens), the last column is written as it is; a list that grew
    has only its new tail counted (``len - nulls``). A running request without a list yet (a
    ``.get``: never inserts into the defaultdict) is looked up again each step until it has one.
    The lists are fetched anew when the running set changes.
    """

    def __init__(self, hisparse: Any) -> None:
        self.hisparse = hisparse
        self._ids: Sequence[str] | None = None
        self._source: Mapping[str, Sequence[Any]] | None = None
        self._lists: list[Sequence[Any]] = []
        self._lens: list[int] = []
        self._counts: list[int] = []
        self._missing: list[int] = []  # indexes of running requests without a list yet
        self._column = b""

    def _req_to_blocks(self) -> Mapping[str, Sequence[Any]] | None:
        sched = getattr(self.hisparse, "connector_scheduler", None)
        coordinator = getattr(sched, "coordinator", None)
        manager = getattr(coordinator, "host_manager", None)
        blocks = getattr(manager, "req_to_blocks", None)
        return blocks if isinstance(blocks, Mapping) else None

    def _fetch(self, ids: Sequence[str], source: Mapping[str, Sequence[Any]]) -> None:
        got: list[Sequence[Any] | None] = list(map(source.get, ids))  # .get: never inserts
        self._missing = [i for i, lst in enumerate(got) if lst is None]
        self._lists = [_NONE if lst is None else lst for lst in got]
        self._lens = [0] * len(ids)
        self._counts = [0] * len(ids)
        self._ids, self._source = ids, source

    def column(self, ids: Sequence[str]) -> bytes:
        """``ids``: the running requests' ids; the same list object as the last call's while the
        running set is unchanged (``RequestColumns.id_list``), a new one when it changed."""
        source = self._req_to_blocks()
        if source is None:  # no coordinator bound (yet): unknown
            self._ids = None
            return _unknown(len(ids))
        if ids is not self._ids or source is not self._source:
            self._fetch(ids, source)
            self._column = b""
        lists = self._lists
        if self._missing:
            still = []
            for i in self._missing:
                lst = source.get(ids[i])
                if lst is None:
                    still.append(i)
                else:
                    lists[i] = lst
            self._missing = still
        lens = list(map(len, lists))
        old = self._lens
        if lens == old and self._column:
            return self._column
        counts = self._counts
        for i in compress(range(len(lens)), map(ne, lens, old)):
            lst, start, end = lists[i], old[i], lens[i]
            if end < start:  # not a list we know how to follow: count it whole
                start, counts[i] = 0, 0
            counts[i] += end - start - sum(map(_IS_NULL, lst[start:end]))
        self._lens = lens
        self._column = i32_column(counts)
        return self._column
