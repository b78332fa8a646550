"""The step window: one engine run's last steps as column arrays, filled once per ring read.

``StepWindow`` is direct-mapped: step ``s`` lives in slot ``s % max_steps``, and the ``step``
column says which step a slot holds (-1: none yet), so a ring read is filed with a few numpy
operations, never one Python object per step. A step arrives in two halves from two processes
(the stat logger's figures, ``file_stats``; the scheduler's request block, ``file_blocks``),
either first: ``halves`` says which came, and a figure no half carried is unknown (``INT_NULL``,
NaN), never 0. A newer step (or a newer run's) evicts the older one in its slot; an older one
arriving for a slot a newer step holds, or a late half of an older run, is not held (it is still
stored).

Request blocks (``collector.channel.blocks.RequestBlock``: the recorder's own bytes, kept as
their place in its ring where they were read from one) are in an object column, bounded by
``max_request_bytes``: the oldest steps give up their blocks (and keep their figures) first.

Storage: a step is handed to the writer (``due``, as a ``collector.columns.StepBatch``) once
its hold has passed (both halves are in by then); a half that comes later hands the step again.

Readers get frozen ``StepRecord``s built from the columns when they ask (``steps``, ``recent``,
``last``...): nothing the window hands out changes afterwards.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from collector.channel.blocks import RequestBlock
from collector.columns import INT64_NULL, INT_NULL, STATS_DTYPE, STEP_DTYPE, StepBatch, stats_of_records
from collector.model import HALF_REQUESTS, HALF_STATS, StepExtra, StepHalves, StepRecord, StepRequests

__all__ = ["DEFAULT_REQUEST_BYTES", "SecondAggregates", "StepWindow", "records_of"]

DEFAULT_REQUEST_BYTES = 8 * 1024 * 1024

# the stat columns a stats half writes whole (nulls included), as the merge of two records did
_STAT_COLS = tuple(n for n in STATS_DTYPE.names or () if n not in ("step", "ts"))
_SUMS = ("prompt_tokens", "generation_tokens", "preemptions", "finished")
_NEWEST = ("running", "waiting", "kv_cache_usage")
_FOLD_FIELDS = ["ts", "step", "running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens", "generation_tokens", "finished"]
FOLD_VECTOR_FROM = 64  # a read of more stats halves than this is folded with reductions per second
_NO_WAITING: dict[str, int] = {}
_NO_CONNECTOR: dict[str, Any] = {}
_NO_DETAILS: dict[str, Any] = {}
_NO_FINISHED: list[dict[str, Any]] = []


def _int(v: int) -> int | None:
    return None if v == INT_NULL else v


def _i64(v: int) -> int | None:
    return None if v == INT64_NULL else v


def _float(v: float) -> float | None:
    return None if v != v else v


class StepWindow:
    """One engine run's steps (the module docstring). Only the event loop files into it;
    readers on other threads get records built from a consistent-enough copy of the slots they
    read (never a live container)."""

    def __init__(self, engine: str, max_steps: int, *, max_request_bytes: int = DEFAULT_REQUEST_BYTES) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.engine = engine
        self.max_steps = cap = max_steps
        self.max_request_bytes = max_request_bytes
        self.step = np.full(cap, -1, dtype=np.int64)
        self.run = np.zeros(cap, dtype=np.int64)
        self.ts = np.zeros(cap, dtype=np.float64)
        self.halves = np.zeros(cap, dtype=np.uint8)
        self.pending = np.zeros(cap, dtype=bool)  # not handed to the writer since it last changed
        self.stats = np.zeros(cap, dtype=STATS_DTYPE)
        self.bmirror = np.full(cap, INT_NULL, dtype=np.int32)  # the block's mirror rows
        self.cmirror = np.full(cap, INT_NULL, dtype=np.int32)  # the connector's (stats half)
        self.host_blocks = np.full(cap, INT_NULL, dtype=np.int32)
        self.extra: npt.NDArray[np.object_] = np.full(cap, None, dtype=object)
        self.block: npt.NDArray[np.object_] = np.full(cap, None, dtype=object)
        self._with_blocks: deque[tuple[StepRequests, int]] = deque()  # (block, step) held, oldest first
        self._block_bytes = 0
        self._held = 0
        self._last_step = -1
        self._last_run = 0
        self._pending: deque[tuple[float, int, npt.NDArray[np.int64]]] = deque()  # (stamp, run, steps)
        self._loose: list[npt.NDArray[np.void]] = []  # rows not held (an older step in a newer's slot)
        self.received = 0
        self.evicted = 0
        self.blocks_evicted = 0  # blocks dropped for the byte bound (their steps kept)
        self.seconds = SecondAggregates(engine)  # what the detectors read
        self._running = self.stats["running"]  # (a view: the column a bare requests half fills)
        self._one_run: int | None = None  # the run of every slot, while only one run filed (-1: several)
        self._extras_held = False  # a slot ever held extras (else the extra columns are all empty)

    def __len__(self) -> int:
        return self._held

    @property
    def request_bytes(self) -> int:
        return self._block_bytes

    # -- filing ------------------------------------------------------------------------------
    def file_stats(self, run: int, rows: npt.NDArray[np.void], extras: Mapping[int, StepExtra], stamp: float) -> None:
        """A read's stats halves (``STATS_DTYPE``, in the order read; ``extras``: by row, the
        rare figures beyond the fixed ones)."""
        n = len(rows)
        if not n:
            return
        self.received += n
        steps = rows["step"]
        if n > 1 and not (steps[1:] > steps[:-1]).all() and len(np.unique(steps)) != n:
            for i in range(n):  # the same step twice in one read: one at a time
                self.file_stats(run, rows[i : i + 1], {0: extras[i]} if i in extras else {}, stamp)
            self.received -= n
            return
        self.seconds.fold_stats(run, rows, extras)
        slots, keep = self._place(run, steps, stamp, stats=True)
        if keep is not None:
            self._set_loose_stats(run, rows[~keep])
            extras = {j: extras[i] for j, i in enumerate(np.flatnonzero(keep).tolist()) if i in extras}
            rows, slots, steps = rows[keep], slots[keep], steps[keep]
            if not len(rows):
                return
        self.stats[slots] = rows
        self.ts[slots] = rows["ts"]
        self.halves[slots] |= HALF_STATS
        if extras or self._extras_held:
            self.extra[slots] = None
            self.cmirror[slots] = INT_NULL
            for i, ex in extras.items():
                slot = int(slots[i])
                self.extra[slot] = ex
                m = ex.connector.get("mirror_rows") if ex.connector else None
                if isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) and abs(m) < 1 << 31:
                    self.cmirror[slot] = int(m)
            self._extras_held = self._extras_held or bool(extras)
        self._track_last(run, int(steps.max()))

    def file_blocks(self, run: int, blocks: Sequence[StepRequests], stamp: float, at: Sequence[tuple[int, float]] = ()) -> None:
        """A read's request blocks (the scheduler's halves), in the order read; ``at``: each
        one's (step, ts) when not the block's own (records made by tests and tools)."""
        n = len(blocks)
        if not n:
            return
        self.received += n
        if at:
            step_list = [s for s, _ in at]
            times = [t for _, t in at]
        else:
            step_list = [b.step for b in blocks]
            times = [b.ts for b in blocks]
        steps = np.array(step_list, dtype=np.int64)
        if n > 1 and not (steps[1:] > steps[:-1]).all() and len(np.unique(steps)) != n:
            for i, b in enumerate(blocks):
                self.file_blocks(run, (b,), stamp, at[i : i + 1])
            self.received -= n
            return
        self.seconds.fold_blocks(run, blocks, step_list, times)
        slots, keep = self._place(run, steps, stamp, stats=False)
        if keep is not None:
            kept = keep.tolist()
            self._set_loose_blocks(run, [x for x, k in zip(zip(blocks, step_list, times, strict=True), kept, strict=True) if not k])
            blocks = [b for b, k in zip(blocks, kept, strict=True) if k]
            times = [t for t, k in zip(times, kept, strict=True) if k]
            step_list = [x for x, k in zip(step_list, kept, strict=True) if k]
            slots = slots[keep]
            if not blocks:
                return
        block_col = self.block
        bytes_ = self._block_bytes
        with_blocks = self._with_blocks
        for slot, b, step in zip(slots.tolist(), blocks, step_list, strict=True):
            old = block_col[slot]
            if old is not None:
                bytes_ -= old.nbytes
            with_blocks.append((b, step))
            block_col[slot] = b
            bytes_ += b.nbytes
        self._block_bytes = bytes_
        self.bmirror[slots] = [INT_NULL if b.mirror_rows is None else min(b.mirror_rows, 0x7FFFFFFF) for b in blocks]
        self.host_blocks[slots] = [INT_NULL if b.host_blocks is None else min(b.host_blocks, 0x7FFFFFFF) for b in blocks]
        bare = (self.halves[slots] & HALF_STATS) == 0  # no stats half yet: the block's figures stand in
        if bare.any():
            self.ts[slots[bare]] = np.array(times)[bare]
            self._running[slots[bare]] = np.array([min(b.running, 0x7FFFFFFF) for b in blocks], dtype=np.int32)[bare]
        self.halves[slots] |= HALF_REQUESTS
        self._evict_blocks()
        self._track_last(run, max(step_list))

    def add(self, rec: StepRecord, stamp: float = 0.0) -> StepRecord:
        """One record, as its halves (tests, the simulator, a JSON step); returns the step now
        held (or the record itself when it is not held). A record that says no half is a
        stats half."""
        halves = rec.halves or (HALF_STATS | (HALF_REQUESTS if rec.request_block is not None else 0))
        if halves & HALF_STATS:
            rows, extras = stats_of_records([rec])
            self.file_stats(rec.run, rows, extras, stamp)
        if halves & HALF_REQUESTS and rec.request_block is not None:
            self.file_blocks(rec.run, (rec.request_block,), stamp, ((rec.step, rec.ts),))
        if halves & HALF_STATS and halves & HALF_REQUESTS:
            self.received -= 1  # one record, both halves
        held = self.get(rec.step)
        return held if held is not None and held.run == rec.run else rec

    def _place(
        self, run: int, steps: npt.NDArray[np.int64], stamp: float, *, stats: bool
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_] | None]:
        """The slots of ``steps``, each begun (cleared: an older step there evicted, handed to
        the writer first if it had not been) or merged into. The second value is None when
        every step is held, else which are (an older step than its slot's is not)."""
        slots = steps % self.max_steps
        held = self.step[slots]
        if self._one_run == run:
            fresh = held < steps
            all_fresh = bool(fresh.all())
            keep = None if all_fresh or (held <= steps).all() else held <= steps
        else:
            held_run = self.run[slots]
            other = held_run != run
            # a newer run's half takes the slot; an older run's (a late half of the run before
            # a restart) is not held, like an older step's
            fresh = np.where(other, held_run < run, held < steps)
            all_fresh = bool(fresh.all())
            ok = fresh | (~other & (held == steps))
            keep = None if ok.all() else ok
            if self._one_run is None and not self._held:
                self._one_run = run
            elif other.any() or self._one_run is None:
                self._one_run = -1  # several runs (a run's id is never -1)
        if all_fresh or fresh.any():
            fs = slots if all_fresh else slots[fresh]
            old = held if all_fresh else held[fresh]
            evicted = old >= 0
            n_evicted = int(evicted.sum())
            if n_evicted:
                self.evicted += n_evicted
                gone = fs[evicted]
                unsent = gone[self.pending[gone]]
                if len(unsent):  # an evicted step not yet handed to the writer: it still is
                    self._loose.append(self._rows(unsent))
                    self.pending[unsent] = False
                if self._block_bytes:
                    for slot in gone[self.block[gone] != None].tolist():  # noqa: E711 - an object column
                        self._block_bytes -= self.block[slot].nbytes
                        self.block[slot] = None
            self._held += len(fs) - n_evicted
            self.step[fs] = steps if all_fresh else steps[fresh]
            self.run[fs] = run
            self.halves[fs] = 0
            self.bmirror[fs] = INT_NULL
            self.host_blocks[fs] = INT_NULL
            if self._extras_held:
                self.extra[fs] = None
                self.cmirror[fs] = INT_NULL
            if not stats:  # a stats half writes every stat column itself
                self.stats[fs] = _EMPTY_STATS
        ks = slots if keep is None else slots[keep]
        newly = ~self.pending[ks]
        if newly.any():
            kept_steps = steps if keep is None else steps[keep]
            self._pending.append((stamp, run, kept_steps if newly.all() else kept_steps[newly]))
            self.pending[ks] = True
        return slots, keep

    def _set_loose_stats(self, run: int, rows: npt.NDArray[np.void]) -> None:
        """Stats halves not held (an older step than its slot's): handed to the writer alone."""
        loose = np.zeros(len(rows), dtype=STEP_DTYPE)
        for name in STEP_DTYPE.names or ():
            if name in STATS_DTYPE.names:  # type: ignore[operator]
                loose[name] = rows[name]
        loose["run"] = run
        loose["mirror_rows"] = INT_NULL
        loose["host_blocks"] = INT_NULL
        self._loose.append(loose)
        self.evicted += len(rows)

    def _set_loose_blocks(self, run: int, items: Sequence[tuple[StepRequests, int, float]]) -> None:
        """Request halves not held: handed to the writer alone."""
        loose = np.zeros(len(items), dtype=STEP_DTYPE)
        loose["ts"] = [t for _, _, t in items]
        loose["step"] = [s for _, s, _ in items]
        loose["run"] = run
        for name in ("waiting", "preemptions", "prompt_tokens", "generation_tokens"):
            loose[name] = INT_NULL
        loose["kv_cache_usage"] = np.nan
        loose["running"] = [b.running for b, _, _ in items]
        loose["mirror_rows"] = [INT_NULL if b.mirror_rows is None else b.mirror_rows for b, _, _ in items]
        loose["host_blocks"] = [INT_NULL if b.host_blocks is None else b.host_blocks for b, _, _ in items]
        self._loose.append(loose)
        self.evicted += len(items)

    def _track_last(self, run: int, step: int) -> None:
        if run != self._last_run or step >= self._last_step:
            self._last_run, self._last_step = run, step

    def set_max_request_bytes(self, n: int) -> None:
        """A new bound for the blocks (the node's budget shared by more engines): the oldest
        steps give up theirs now, down to it."""
        self.max_request_bytes = n
        self._evict_blocks()

    def _evict_blocks(self) -> None:
        with_blocks, block_col, cap = self._with_blocks, self.block, self.max_steps
        while self._block_bytes > self.max_request_bytes and len(with_blocks) > 1:
            block, step = with_blocks.popleft()
            slot = step % cap
            if block_col[slot] is block:  # (still that step's: not evicted or replaced since)
                self._block_bytes -= block.nbytes
                block_col[slot] = None
                self.blocks_evicted += 1
        while with_blocks and block_col[with_blocks[0][1] % cap] is not with_blocks[0][0]:
            with_blocks.popleft()  # a block its step gave up otherwise (evicted, replaced)

    # -- to storage --------------------------------------------------------------------------
    def unsent(self) -> int:
        """Steps not handed to the writer yet."""
        return int(self.pending.sum()) + sum(len(x) for x in self._loose)

    def next_stamp(self) -> float | None:
        """When the oldest step not handed to the writer yet was filed (None: none is)."""
        if self._loose:
            return -math.inf
        return self._pending[0][0] if self._pending else None

    def due(self, cutoff: float, *, everything: bool = False) -> StepBatch | None:
        """The steps whose hold has passed (first half filed at or before ``cutoff``), merged,
        in step order, as one batch; None when there are none."""
        pending = self._pending
        picked: list[npt.NDArray[np.int64]] = []
        runs: list[int] = []
        while pending and (everything or pending[0][0] <= cutoff):
            _, run, steps = pending.popleft()
            picked.append(steps)
            runs.append(run)
        parts: list[npt.NDArray[np.void]] = self._loose
        self._loose = []
        for run, steps in zip(runs, picked, strict=True):
            slots = steps % self.max_steps
            ok = (self.step[slots] == steps) & (self.run[slots] == run) & self.pending[slots]
            slots = slots[ok]
            if not len(slots):
                continue
            self.pending[slots] = False
            parts.append(self._rows(slots))
        if not parts:
            return None
        cols = parts[0] if len(parts) == 1 else np.concatenate(parts)
        order = np.lexsort((cols["step"], cols["run"]))
        if len(order) > 1 and not (np.diff(order) == 1).all():
            cols = cols[order]
        return StepBatch(self.engine, cols)

    def _rows(self, slots: npt.NDArray[np.intp]) -> npt.NDArray[np.void]:
        out = np.empty(len(slots), dtype=STEP_DTYPE)
        st = self.stats[slots]
        out["ts"] = self.ts[slots]
        out["step"] = self.step[slots]
        out["run"] = self.run[slots]
        for name in ("running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens", "generation_tokens"):
            out[name] = st[name]
        bm = self.bmirror[slots]
        out["mirror_rows"] = np.where(bm != INT_NULL, bm, self.cmirror[slots])
        out["host_blocks"] = self.host_blocks[slots]
        return out

    # -- reading -----------------------------------------------------------------------------
    def _held_slots(self) -> npt.NDArray[np.intp]:
        """The held slots in step order, an earlier run's first."""
        slots = np.flatnonzero(self.step >= 0)
        steps = self.step[slots]
        runs = self.run[slots]
        if (runs == self._last_run).all():
            return slots[np.argsort(steps, kind="stable")]
        return slots[np.lexsort((steps, runs == self._last_run))]

    def steps(self) -> list[StepRecord]:
        """The held steps in step order (new records), an earlier run's first."""
        return self._records(self._held_slots())

    def recent(self, n: int) -> list[StepRecord]:
        """The last ``n`` steps, oldest first."""
        return self._records(self._held_slots()[-n:] if n > 0 else np.empty(0, dtype=np.intp))

    def last(self) -> StepRecord | None:
        if self._last_step < 0:
            return None
        return self.get(self._last_step)

    def last_known(self, name: str, *, within: int = 64) -> StepRecord | None:
        """The newest of the last ``within`` steps that carries ``name`` (a step's stats half
        lands milliseconds after its requests half: the live gauges must not flap to absent)."""
        if self._last_step < 0:
            return None
        steps = self._last_step - np.arange(min(within, self.max_steps), dtype=np.int64)
        steps = steps[steps >= 0]
        slots = steps % self.max_steps
        ok = (self.step[slots] == steps) & (self.run[slots] == self._last_run)
        if name in STATS_DTYPE.names:  # type: ignore[operator]
            col = self.stats[name][slots]
            ok &= ~np.isnan(col) if col.dtype.kind == "f" else col != (INT_NULL if col.dtype.itemsize == 4 else INT64_NULL)
            if name == "running":
                ok &= (self.halves[slots] & HALF_STATS).astype(bool) | (self.block[slots] != None)  # noqa: E711
            hit = np.flatnonzero(ok)
            return self._records(slots[hit[:1]])[0] if len(hit) else None
        for slot in slots[ok].tolist():
            rec = self._records(np.array([slot]))[0]
            if getattr(rec, name) is not None:
                return rec
        return None

    def get(self, step: int) -> StepRecord | None:
        if step < 0:
            return None
        slot = step % self.max_steps
        if self.step[slot] != step:
            return None
        return self._records(np.array([slot], dtype=np.intp))[0]

    def _records(self, slots: npt.NDArray[np.intp]) -> list[StepRecord]:
        if not len(slots):
            return []
        return _Columns.of(self, slots).records()

    def held(self) -> HeldSteps:
        """The held steps in step order (an earlier run's first) as a sequence whose records are
        built when first read: a copy of their columns now (a capture at a fault, on the event
        loop), their records later (the snapshot's build, in a thread)."""
        return HeldSteps(_Columns.of(self, self._held_slots()))


@dataclass(frozen=True, slots=True)
class _Columns:
    """A copy of some slots' columns, in order."""

    engine: str
    step: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    run: npt.NDArray[np.int64]
    halves: npt.NDArray[np.uint8]
    extra: npt.NDArray[np.object_]
    block: npt.NDArray[np.object_]
    stats: npt.NDArray[np.void]

    @classmethod
    def of(cls, w: StepWindow, slots: npt.NDArray[np.intp]) -> _Columns:
        return cls(w.engine, w.step[slots], w.ts[slots], w.run[slots], w.halves[slots], w.extra[slots], w.block[slots], w.stats[slots])

    def __len__(self) -> int:
        return len(self.step)

    def records(self, start: int = 0, stop: int | None = None) -> list[StepRecord]:
        part = slice(start, stop)
        st = self.stats[part]
        # each figure column once as Python values, None where unknown (no call per value)
        figures = [_known(st[name]) for name in _RECORD_FIGURES]
        waiting_raw = st["waiting"].tolist()
        deferred_raw = st["deferred"].tolist()
        engine = self.engine
        out: list[StepRecord] = []
        append = out.append
        for step, ts, run, halves, extra, block, w_raw, d_raw, engine_index, running, waiting, kv, pre, prompt, gen, fin, pq, ph in zip(
            self.step[part].tolist(),
            self.ts[part].tolist(),
            self.run[part].tolist(),
            self.halves[part].tolist(),
            self.extra[part].tolist(),
            self.block[part].tolist(),
            waiting_raw,
            deferred_raw,
            st["engine_index"].tolist(),
            *figures,
            strict=True,
        ):
            if extra is not None:
                by_reason = extra.waiting_by_reason
                if by_reason is None:
                    by_reason = _split(w_raw, d_raw)
                connector, worker, details = extra.connector, extra.worker, extra.details
            else:
                by_reason = _split(w_raw, d_raw) if halves & HALF_STATS else _NO_WAITING
                connector, worker, details = _NO_CONNECTOR, None, _NO_DETAILS
            # positional, in the dataclass's field order (a keyword call costs a third more)
            append(
                StepRecord(
                    engine,
                    ts,
                    step,
                    running,
                    waiting,
                    kv,
                    pre,
                    prompt,
                    gen,
                    fin,
                    by_reason,
                    pq,
                    ph,
                    connector,
                    engine_index,
                    worker,
                    _NO_FINISHED,
                    block,
                    details,
                    halves,
                    run,
                )
            )
        return out


class HeldSteps(Sequence[StepRecord]):
    """A window's held steps at one moment (``StepWindow.held``): records built on first read,
    then kept by this sequence (never by the window)."""

    def __init__(self, cols: _Columns) -> None:
        self._cols = cols
        self._built: list[StepRecord] | None = None

    def with_resident_blocks(self) -> tuple[HeldSteps, int]:
        """These steps with every request block left in a ring copied out of it
        (``RequestBlock.resident``: its bytes, or ``gone`` when the ring no longer holds them),
        the records still built on first read; and how many were gone."""
        col = self._cols.block
        at = [i for i, b in enumerate(col.tolist()) if b is not None and not getattr(b, "held", True)]
        if not at:
            return self, 0
        new = col.copy()
        held = RequestBlock.resident_many(col[at].tolist())
        new[at] = held
        return HeldSteps(dataclasses.replace(self._cols, block=new)), sum(b.gone for b in held)

    def __len__(self) -> int:
        return len(self._cols)

    def _all(self) -> list[StepRecord]:
        if self._built is None:
            self._built = self._cols.records()
        return self._built

    @overload
    def __getitem__(self, i: int) -> StepRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[StepRecord]: ...
    def __getitem__(self, i: int | slice) -> StepRecord | list[StepRecord]:
        if isinstance(i, slice) or self._built is not None:
            return self._all()[i]
        n = len(self._cols)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(i)
        return self._cols.records(j, j + 1)[0]

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self._all())

    def __reversed__(self) -> Iterator[StepRecord]:
        return reversed(self._all())


_RECORD_FIGURES = (
    "running",
    "waiting",
    "kv_cache_usage",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "finished",
    "prefix_cache_queries",
    "prefix_cache_hits",
)


def _known(col: npt.NDArray[Any]) -> list[Any]:
    """A figure column as Python values, None where unknown (``INT_NULL``, NaN)."""
    if col.dtype.kind == "f":
        unknown = np.isnan(col)
    else:
        unknown = col == (INT64_NULL if col.dtype.itemsize == 8 else INT_NULL)
    if not unknown.any():
        return col.tolist()  # type: ignore[no-any-return]
    values = col.astype(object)
    values[unknown] = None
    return values.tolist()  # type: ignore[no-any-return]


_SPLITS: dict[tuple[int, int], dict[str, int]] = {}


def _split(waiting: int, deferred: int) -> dict[str, int]:
    """The waiting split of a plain step (``capacity``, ``deferred``): one shared dict per pair
    (nothing changes a record's containers)."""
    if deferred == INT_NULL:
        return _NO_WAITING
    key = (max((0 if waiting == INT_NULL else waiting) - deferred, 0), deferred)
    got = _SPLITS.get(key)
    if got is None:
        if len(_SPLITS) >= 4096:
            _SPLITS.clear()
        got = _SPLITS[key] = {"capacity": key[0], "deferred": deferred}
    return got


def _empty_stats() -> npt.NDArray[np.void]:
    row = np.zeros(1, dtype=STATS_DTYPE)
    for name in STATS_DTYPE.names or ():
        if name in ("step", "engine_index"):
            continue
        kind = STATS_DTYPE[name]
        row[name] = np.nan if kind.kind == "f" else (INT64_NULL if kind.itemsize == 8 else INT_NULL)
    return row  # one row: it broadcasts over the slots it clears


_EMPTY_STATS = _empty_stats()


@dataclass(slots=True)
class _Second:
    """One second's aggregate, as folded so far (internal: readers get ``StepRecord``s)."""

    ts: float
    step: int
    run: int
    halves: int = 0
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None
    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    preemptions: int | None = None
    finished: int | None = None
    connector: dict[str, Any] = field(default_factory=dict)
    request_block: StepRequests | None = None
    built: StepRecord | None = None  # its record, made when a later second began (a late half redoes it)


class SecondAggregates:
    """One engine's steps folded into one record per second, for the detectors: a tick reads
    tens of these instead of hundreds of steps. Folded per ring read, on the columns.

    Per second (by each half's own timestamp): the newest ``running``, ``waiting``,
    ``kv_cache_usage``, connector stats and request block (host blocks); the sums of
    ``prompt_tokens``, ``generation_tokens``, ``preemptions`` and ``finished``. A figure no
    step of the second carried stays None (unknown, not 0). ``ts`` is the newest step's."""

    def __init__(self, engine: str = "", seconds: int = 120) -> None:
        self.engine = engine
        self._buckets: deque[_Second] = deque(maxlen=seconds)
        self._late: list[_Second] = []

    def _bucket(self, second: int, ts: float, step: int, run: int) -> _Second | None:
        buckets = self._buckets
        for held in reversed(buckets):  # the newest, or one of the last few for a late half
            key = int(held.ts)
            if key == second:
                if held is not buckets[-1]:
                    self._late.append(held)
                return held
            if key < second:
                break
        if buckets and second < int(buckets[-1].ts):
            return None  # a late half of a second that has passed with no other step: let it go
        if buckets:  # the newest second is over: its record, once (the detectors read it each tick)
            last = buckets[-1]
            last.built = self._record(last)
        agg = _Second(ts=ts, step=step, run=run)
        buckets.append(agg)
        return agg

    def _settle(self) -> None:
        """Past seconds a late half changed: their records again."""
        for agg in self._late:
            agg.built = self._record(agg)
        self._late.clear()

    def fold_stats(self, run: int, rows: npt.NDArray[np.void], extras: Mapping[int, StepExtra]) -> None:
        """A read's stats halves folded in: a read of a few steps over its rows' values in one
        pass; a longer one (a second's read at 100 steps/s, a catch-up) with reductions per
        second."""
        if len(rows) > FOLD_VECTOR_FROM:
            self._fold_columns(run, rows, extras)
            self._settle()
            return
        agg: _Second | None = None
        second = -1
        conn = {i: ex.connector for i, ex in extras.items() if ex.connector} if extras else None
        for i, (ts, step, running, waiting, kv, pre, prompt, gen, fin) in enumerate(rows[_FOLD_FIELDS].tolist()):
            sec = math.floor(ts) if ts == ts else 0
            if agg is None or sec != second:
                agg, second = self._bucket(sec, ts, step, run), sec
                if agg is None:
                    continue
            if ts > agg.ts:
                agg.ts = ts
            if step > agg.step:
                agg.step = step
            agg.halves |= HALF_STATS
            if running != INT_NULL:
                agg.running = running
            if waiting != INT_NULL:
                agg.waiting = waiting
            if kv == kv:
                agg.kv_cache_usage = kv
            if pre != INT_NULL:
                agg.preemptions = (agg.preemptions or 0) + pre
            if prompt != INT_NULL:
                agg.prompt_tokens = (agg.prompt_tokens or 0) + prompt
            if gen != INT_NULL:
                agg.generation_tokens = (agg.generation_tokens or 0) + gen
            if fin != INT_NULL:
                agg.finished = (agg.finished or 0) + fin
            if conn and i in conn:
                agg.connector = conn[i]
        if self._late:
            self._settle()

    def _fold_columns(self, run: int, rows: npt.NDArray[np.void], extras: Mapping[int, StepExtra]) -> None:
        ts = rows["ts"]
        secs = np.floor(ts).astype(np.int64)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(secs)) + 1))
        ends = np.append(starts[1:], len(rows))
        idx = np.arange(len(rows))
        newest: dict[str, list[int]] = {}
        for name in _NEWEST:
            col = rows[name]
            known = ~np.isnan(col) if col.dtype.kind == "f" else col != INT_NULL
            newest[name] = np.maximum.reduceat(np.where(known, idx, -1), starts).tolist()
        sums: dict[str, tuple[list[int], list[bool]]] = {}
        for name in _SUMS:
            col = rows[name]
            known = col != INT_NULL
            sums[name] = (
                np.add.reduceat(np.where(known, col, 0).astype(np.int64), starts).tolist(),
                np.logical_or.reduceat(known, starts).tolist(),
            )
        tmax = np.maximum.reduceat(ts, starts).tolist()
        smax = np.maximum.reduceat(rows["step"], starts).tolist()
        first_ts = ts[starts].tolist()
        first_step = rows["step"][starts].tolist()
        values = {name: rows[name].tolist() for name in _NEWEST}
        conn_rows = sorted(i for i, ex in extras.items() if ex.connector)
        for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            agg = self._bucket(int(math.floor(first_ts[k])), first_ts[k], first_step[k], run)
            if agg is None:
                continue
            if tmax[k] > agg.ts:
                agg.ts = tmax[k]
            if smax[k] > agg.step:
                agg.step = smax[k]
            agg.halves |= HALF_STATS
            for name in _NEWEST:
                j = newest[name][k]
                if j >= 0:
                    setattr(agg, name, values[name][j])
            for name in _SUMS:
                total, known = sums[name][0][k], sums[name][1][k]
                if known:
                    setattr(agg, name, (getattr(agg, name) or 0) + total)
            for i in conn_rows:
                if a <= i < b:
                    agg.connector = extras[i].connector

    def fold_blocks(self, run: int, blocks: Sequence[StepRequests], steps: Sequence[int], times: Sequence[float]) -> None:
        seconds: dict[int, list[Any]] = {}  # second -> [first ts, first step, max ts, max step, newest block]
        for b, step, ts in zip(blocks, steps, times, strict=True):
            s = int(ts // 1) if math.isfinite(ts) else 0
            got = seconds.get(s)
            if got is None:
                seconds[s] = [ts, step, ts, step, b]
            else:
                got[2], got[3], got[4] = max(got[2], ts), max(got[3], step), b
        for s, (ts0, step0, ts1, step1, b) in seconds.items():
            agg = self._bucket(s, ts0, step0, run)
            if agg is None:
                continue
            if ts1 > agg.ts:
                agg.ts = ts1
            if step1 > agg.step:
                agg.step = step1
            agg.halves |= HALF_REQUESTS
            agg.request_block = b
            if not agg.halves & HALF_STATS:
                agg.running = b.running
        if self._late:
            self._settle()

    def all(self) -> list[StepRecord]:
        """The seconds held, oldest first, as records (the newest second's a new one each call:
        it may still grow)."""
        buckets = list(self._buckets)
        out = [agg.built or self._record(agg) for agg in buckets[:-1]]
        if buckets:
            out.append(self._record(buckets[-1]))
        return out

    def _record(self, agg: _Second) -> StepRecord:
        return StepRecord(
            engine=self.engine,
            ts=agg.ts,
            step=agg.step,
            run=agg.run,
            running=agg.running,
            waiting=agg.waiting,
            kv_cache_usage=agg.kv_cache_usage,
            prompt_tokens=agg.prompt_tokens,
            generation_tokens=agg.generation_tokens,
            preemptions=agg.preemptions,
            finished=agg.finished,
            connector=agg.connector,
            request_block=agg.request_block,
            halves=agg.halves,
        )


def records_of(halves: Sequence[StepHalves]) -> list[StepRecord]:
    """Step halves as the records a window would hold for them, merged per engine run and in
    step order (tools and tests: the sidecar files halves into its windows)."""
    windows: dict[tuple[str, int], StepWindow] = {}
    for h in halves:
        key = (h.engine, h.run)
        w = windows.get(key)
        if w is None:
            w = windows[key] = StepWindow(h.engine, 1 << 16, max_request_bytes=1 << 62)
        if h.stats is not None and len(h.stats):
            w.file_stats(h.run, h.stats, h.extras, 0.0)
        if h.blocks:
            w.file_blocks(h.run, h.blocks, 0.0, h.block_at)
    return [rec for w in windows.values() for rec in w.steps()]
