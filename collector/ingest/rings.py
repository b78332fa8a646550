"""The flight recorder's memory: bounded rings of the last steps, GPU samples and log lines.

``EngineRing`` keeps the last ``max_steps`` steps of one engine. A step can arrive in two
halves from two processes (the stat logger's aggregates and the scheduler's per-request
block), so records with the same step number are merged, whichever comes first; a figure no
half carried stays None. Per-request blocks are the recorder's own bytes
(``collector.channel.blocks``) and are bounded by ``max_request_bytes`` as well: at 256
running requests a step's block is ~5-16 KB, so the oldest steps give up their blocks (and
keep their aggregates) first.

Records are never changed once held: a merge files a new record for the step (the writer's
queue is offered it), and a step that gives up its block is replaced by a copy without it, so
a capture taken at a fault, or a row queued for the database, holds what it held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice

from collector.model import HALF_REQUESTS, HALF_STATS, STAT_FIELDS, GpuSample, LogLine, StepRecord, StepRequests

DEFAULT_REQUEST_BYTES = 8 * 1024 * 1024


class EngineRing:
    """Steps in arrival order (step order per writer), merged by step number.

    Only the event loop touches it. Readers on other threads (the API's workers) must use
    ``steps()``/``last()``, which copy under no lock but never iterate the live dict."""

    def __init__(self, max_steps: int, *, max_request_bytes: int = DEFAULT_REQUEST_BYTES) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.max_steps = max_steps
        self.max_request_bytes = max_request_bytes
        self._steps: dict[int, StepRecord] = {}
        self._order: deque[tuple[int, int]] = deque()  # (run, step)
        self._with_blocks: deque[tuple[int, int]] = deque()  # (run, step) holding a block, oldest first
        self._block_bytes = 0
        self._last: StepRecord | None = None
        self._out_of_order = False  # a step arrived below the newest: steps() must sort
        self.received = 0
        self.evicted = 0
        self.blocks_evicted = 0  # blocks dropped for the byte bound (their steps kept)
        self.seconds = SecondAggregates()  # what the detectors read

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def request_bytes(self) -> int:
        return self._block_bytes

    def add(self, rec: StepRecord) -> StepRecord:
        """Insert, or merge into a new record; returns the record now held for that step."""
        self.received += 1
        self.seconds.fold(rec)
        held = self._steps.get(rec.step)
        if held is None or held.run != rec.run:
            if held is not None:  # a new run of the engine reuses step numbers
                self._drop(rec.step)
            self._steps[rec.step] = rec
            self._order.append((rec.run, rec.step))
            if rec.request_block is not None:
                self._track_block(rec, rec.request_block)
            while len(self._steps) > self.max_steps and self._order:
                run, step = self._order.popleft()
                cur = self._steps.get(step)
                if cur is not None and cur.run == run:
                    self._drop(step)
                    self.evicted += 1
            if self._last is None or rec.step >= self._last.step or rec.run != self._last.run:
                self._last = rec
            else:
                self._out_of_order = True
            return self._steps.get(rec.step, rec)
        merged = held.copy()
        if rec.halves & HALF_STATS:
            for name in STAT_FIELDS:
                setattr(merged, name, getattr(rec, name))
            merged.ts = rec.ts
        block = rec.request_block if rec.halves & HALF_REQUESTS else None
        if block is not None:
            if held.request_block is not None:
                self._block_bytes -= held.request_block.nbytes
            merged.request_block = block
            if not merged.halves & HALF_STATS:
                merged.running = rec.running
        merged.halves |= rec.halves
        self._steps[rec.step] = merged
        if self._last is held:
            self._last = merged
        if block is not None:
            if held.request_block is None:
                self._track_block(merged, block)
            else:
                self._block_bytes += block.nbytes
        return self._steps[rec.step]

    def set_max_request_bytes(self, n: int) -> None:
        """A new bound for the blocks (the node's budget shared by more engines): the oldest
        steps give up theirs now, down to it."""
        self.max_request_bytes = n
        self._evict_blocks()

    def _track_block(self, rec: StepRecord, block: StepRequests) -> None:
        self._with_blocks.append((rec.run, rec.step))
        self._block_bytes += block.nbytes
        self._evict_blocks()

    def _evict_blocks(self) -> None:
        while self._block_bytes > self.max_request_bytes and len(self._with_blocks) > 1:
            run, step = self._with_blocks.popleft()
            old = self._steps.get(step)
            if old is not None and old.run == run and old.request_block is not None:
                self._block_bytes -= old.request_block.nbytes
                self._steps[step] = bare = old.copy()  # the held record is not changed
                bare.request_block = None
                if self._last is old:
                    self._last = bare
                self.blocks_evicted += 1

    def _drop(self, step: int) -> None:
        old = self._steps.pop(step, None)
        if old is not None and old.request_block is not None:
            self._block_bytes -= old.request_block.nbytes

    def steps(self) -> list[StepRecord]:
        """The held steps in step order (a copy), an earlier run's first. Arrival order is step
        order per writer and a merge never moves a step, so it sorts only after a step arrived
        out of order (a sort of the whole ring per engine per second cost the detector task)."""
        if self._out_of_order:
            run = self._run()
            return sorted(list(self._steps.values()), key=lambda r: (r.run == run, r.step))
        return list(self._steps.values())

    def recent(self, n: int) -> list[StepRecord]:
        """The last ``n`` steps, oldest first, without copying the whole ring."""
        out = [self._steps[step] for _, step in islice(reversed(self._order), n) if step in self._steps]
        out.reverse()
        return out

    def _run(self) -> int:
        return self._last.run if self._last is not None else 0

    def last(self) -> StepRecord | None:
        return self._last

    def last_known(self, name: str, *, within: int = 64) -> StepRecord | None:
        """The newest of the last ``within`` steps that carries ``name`` (a step's stats half
        lands milliseconds after its requests half: the live gauges must not flap to absent)."""
        for run, step in islice(reversed(self._order), within):
            rec = self._steps.get(step)
            if rec is not None and rec.run == run and getattr(rec, name) is not None:
                return rec
        return None

    def get(self, step: int) -> StepRecord | None:
        return self._steps.get(step)


class SecondAggregates:
    """One engine's steps folded into one record per second as they arrive, for the detectors:
    a tick reads tens of these instead of hundreds of steps (walking the last 512 steps of
    each engine was most of the detector task's time at 8 engines x 100 steps/s).

    Per second (by each half's own timestamp): the newest ``running``, ``waiting``,
    ``kv_cache_usage``, connector stats and request block (host blocks); the sums of
    ``prompt_tokens``, ``generation_tokens``, ``preemptions`` and ``finished``. A figure no
    step of the second carried stays None (unknown, not 0). ``ts`` is the newest step's."""

    def __init__(self, seconds: int = 120) -> None:
        self._buckets: deque[StepRecord] = deque(maxlen=seconds)

    def fold(self, rec: StepRecord) -> None:
        second = int(rec.ts)
        buckets = self._buckets
        agg = None
        for held in reversed(buckets):  # the newest, or one of the last few for a late half
            key = int(held.ts)
            if key == second:
                agg = held
                break
            if key < second:
                break
        if agg is None:
            if buckets and second < int(buckets[-1].ts):
                return  # a late half of a second that has passed with no other step: let it go
            agg = StepRecord(engine=rec.engine, ts=rec.ts, step=rec.step, run=rec.run)
            buckets.append(agg)
        if rec.ts > agg.ts:
            agg.ts = rec.ts
        if rec.step > agg.step:
            agg.step = rec.step
        if rec.halves & HALF_STATS:
            agg.halves |= HALF_STATS
            if rec.running is not None:
                agg.running = rec.running
            if rec.waiting is not None:
                agg.waiting = rec.waiting
            if rec.kv_cache_usage is not None:
                agg.kv_cache_usage = rec.kv_cache_usage
            if rec.prompt_tokens is not None:
                agg.prompt_tokens = (agg.prompt_tokens or 0) + rec.prompt_tokens
            if rec.generation_tokens is not None:
                agg.generation_tokens = (agg.generation_tokens or 0) + rec.generation_tokens
            if rec.preemptions is not None:
                agg.preemptions = (agg.preemptions or 0) + rec.preemptions
            if rec.finished is not None:
                agg.finished = (agg.finished or 0) + rec.finished
            if rec.connector:
                agg.connector = rec.connector
        if rec.request_block is not None:
            agg.halves |= HALF_REQUESTS
            agg.request_block = rec.request_block
            if not agg.halves & HALF_STATS:
                agg.running = rec.request_block.running

    def all(self) -> list[StepRecord]:
        """The seconds held, oldest first (a copy of the list; the newest may still grow)."""
        return list(self._buckets)


class TimeRing:
    """Samples of the last ``seconds`` (by their own timestamps), at most ``max_items``."""

    def __init__(self, seconds: float, max_items: int = 100_000) -> None:
        self.seconds = seconds
        self._items: deque[GpuSample] = deque(maxlen=max_items)

    def add(self, item: GpuSample) -> None:
        self._items.append(item)
        horizon = item.ts - self.seconds
        while self._items and self._items[0].ts < horizon:
            self._items.popleft()

    def since(self, ts: float) -> list[GpuSample]:
        return [s for s in self._items if s.ts >= ts]

    def last(self) -> GpuSample | None:
        return self._items[-1] if self._items else None

    def __len__(self) -> int:
        return len(self._items)


class LineRing:
    def __init__(self, max_lines: int) -> None:
        self._lines: deque[LogLine] = deque(maxlen=max_lines)

    def add(self, line: LogLine) -> None:
        self._lines.append(line)

    def extend(self, lines: Iterable[LogLine]) -> None:
        self._lines.extend(lines)

    def all(self) -> list[LogLine]:
        return list(self._lines)
