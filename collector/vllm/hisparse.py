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
from collections.abc import Iterable, Mapping, Sequence
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


def _rows_uniform(spans: Iterable[Sequence[Any]], width: int) -> list[int]:
    """Each request's rows when every request has ``width`` (1 or 2) mirrors: one comprehension
    whose tuple unpacking checks the width (a request with another count raises ValueError)."""
    if width == 1:
        return [a.num_rows for (a,) in spans]
    return [a.num_rows + b.num_rows for a, b in spans]


def _rows_any(spans: Iterable[Sequence[Any]]) -> list[int]:
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

    What is kept is the last column: a decode step mirrors as many rows per request as the one
    before (the tokens it schedules), so when the rows read are the same numbers (small ints,
    compared by identity) the last column's bytes are returned, the same object, which the
    record's writer takes as a column that did not change (``RequestRecorder.write_encoded``).
    """

    def __init__(self) -> None:
        self._width = 1
        self._rows: list[int] = []
        self._column = b""
        self._meta_type: Any = None  # where row_mirrors was found last: the metadata's type
        self._sub = -1  # and the index of the HiSparse metadata in it (-1: the metadata itself)

    def rows_of(self, metadata: Any) -> Mapping[str, Sequence[Any]] | None:
        """``row_mirrors_of(metadata)``, tried first where it was found in the last step's
        metadata: the search (a ``getattr`` on the MultiConnector's metadata, then on each
        sub-connector's before HiSparse's, and a Mapping check) cost 0.9 us a step, the place
        remembered 0.2."""
        if type(metadata) is self._meta_type:
            try:
                rows = (metadata if self._sub < 0 else metadata.metadata[self._sub]).row_mirrors
            except (AttributeError, IndexError, TypeError):
                pass
            else:
                if type(rows) is dict:
                    return rows
        rows = row_mirrors_of(metadata)
        self._meta_type = None
        if rows is not None:
            if getattr(metadata, "row_mirrors", None) is rows:
                self._meta_type, self._sub = type(metadata), -1
            else:
                for i, sub in enumerate(getattr(metadata, "metadata", None) or ()):
                    if getattr(sub, "row_mirrors", None) is rows:
                        self._meta_type, self._sub = type(metadata), i
                        break
        return rows

    def column(self, ids: Sequence[str], row_mirrors: Mapping[str, Sequence[Any]] | None) -> bytes:
        if row_mirrors is None:
            return _unknown(len(ids))
        spans: Iterable[Sequence[Any]]
        if len(row_mirrors) == len(ids) and list(row_mirrors) == ids:
            spans = row_mirrors.values()
        else:
            spans = list(map(row_mirrors.get, ids, repeat(_NONE)))
        try:
            rows = _rows_uniform(spans, self._width)
        except ValueError:  # not every request has that many spans this step
            spans = list(spans)
            lens = set(map(len, spans))
            width = lens.pop() if len(lens) == 1 else 0
            if width in (1, 2):
                self._width = width
                rows = _rows_uniform(spans, width)
            else:
                rows = _rows_any(spans)
        if rows == self._rows and self._column:
            return self._column
        self._rows = rows
        self._column = column = i32_column(rows)
        return column


def mirror_rows_column(ids: Sequence[str], row_mirrors: Mapping[str, Sequence[Any]] | None) -> bytes:
    """One i32 per request: rows mirrored this step; all -1 when the step had no metadata (a
    one-off ``MirrorRows().column``)."""
    return MirrorRows().column(ids, row_mirrors)


class HostBlocks:
    """Counts the host blocks the coordinator holds per running request, kept across steps.

    Where they live: ``host_manager.req_to_blocks``, a defaultdict of one list per request
    (vllm/v1/core/single_type_kv_cache_manager.py:125 in vLLM 0.32). How that list changes, and
    why the sum of the lengths is enough to see that none moved:

    - it is created on a request's first allocation and removed whole, by ``pop``, when the
      request is freed (:576, the only removal); a freed request leaves ``running`` (finished or
      preempted), so a list held for an unchanged running set is the request's live list;
    - while it lives it only grows (``append``/``extend`` in ``allocate_new_blocks`` and
      ``add_local_computed_blocks``, :311), or has a block swapped for its copy-on-write copy
      (:472), a real block for a real one;
    - a block is turned into the null block in place only by ``remove_skipped_blocks`` (:668), a
      no-op for the host group: ``HiSparseSourceManager`` (:2200) is a ``FullAttentionManager``,
      whose ``get_num_skipped_tokens`` is 0 (:712-723).

    No list held gets shorter, so after a step in which no list moved, the lists' total length
    is the same only when none moved since: then the last column is written as it is. One
    ``sum(map(len, ...))`` touches only the lists' heads, and each length's int is freed before
    the next is made; a list of the lengths, compared with the last one, cost a third more, and
    following each list's last block more again (it reads the block too). Otherwise the lengths
    are compared and a list that grew has only its new tail counted (``len - nulls``); one that
    got shorter (a vLLM that truncates) is counted whole, and from then on every step compares
    the lengths (a first shortening that another list's growth cancels within one quiet step is
    seen at the next step that moves the total). A block holds 64 tokens, so a decode
    step grows about one list in 64: at a few dozen running requests most steps move none and
    take the sum; at 256 most move a few, and the sum is skipped while the last step moved. A running
    request without a list yet (a ``.get``: never inserts into the defaultdict) is looked up again
    each step until it has one.

    The lists are fetched anew when the running set changes; a list held before keeps its
    count, so a request joining or leaving costs a look-up per running request, not a count of
    every block again.
    """

    def __init__(self, hisparse: Any) -> None:
        self.hisparse = hisparse
        self._ids: Sequence[str] | None = None
        self._source: Mapping[str, Sequence[Any]] | None = None
        self._lists: list[Sequence[Any]] = []
        self._lens: list[int] = []
        self._counts: list[int] = []
        self._total = 0  # the lists' total length when they were last seen not moving
        self._quiet = False  # whether they were, at the last step
        # A list seen shorter than before (a vLLM that truncates): one sum no longer tells, as
        # one list's growth may cancel another's loss; every length is compared from then on.
        self._shrinks = False
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
        held = {}
        if source is self._source:  # the lists held so far, with their counts
            held = {id(lst): (lst, n, c) for lst, n, c in zip(self._lists, self._lens, self._counts, strict=True) if lst is not _NONE}
        lists: list[Sequence[Any]] = []
        lens: list[int] = []
        counts: list[int] = []
        missing = []
        for i, lst in enumerate(got):
            if lst is None:
                missing.append(i)
                lst = _NONE
            kept = held.get(id(lst))
            if kept is not None and kept[0] is lst:
                lens.append(kept[1])
                counts.append(kept[2])
            else:
                lens.append(0)
                counts.append(0)
            lists.append(lst)
        self._lists, self._lens, self._counts, self._missing = lists, lens, counts, missing
        self._quiet = False
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
                    self._quiet = False
            self._missing = still
        if self._quiet and self._column and not self._shrinks:  # no list moved in the last step: one sum says if any did now
            if sum(map(len, lists)) == self._total:
                return self._column
        lens = list(map(len, lists))
        old, counts = self._lens, self._counts
        if lens == old and self._column:
            self._quiet, self._total = True, sum(lens)
            return self._column
        for i in compress(range(len(lens)), map(ne, lens, old)):
            lst, start, end = lists[i], old[i], lens[i]
            if end < start:  # not a list we know how to follow: count it whole
                start, counts[i] = 0, 0
                self._shrinks = True
            counts[i] += end - start - sum(map(_IS_NULL, lst[start:end]))
        self._lens, self._quiet = lens, False
        self._column = i32_column(counts)
        return self._column
