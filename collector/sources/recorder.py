"""Reads the in-engine recorder's ring files (``collector.channel``) and emits their records.

Every ``*.ring`` file in the recorder folder is one writing process: the stat-logger plugin in
vLLM's API server (``role: stats``) or the RecordingScheduler in the engine core (``role:
sched``). A file whose writer process is gone and that has stopped growing means the engine
died: that is reported once as a ``recorder_silent`` event, which is a snapshot trigger, after
the last records were read (so the snapshot holds the steps up to the death).

When the sidecar cannot keep up (CPU starved, a catch-up too large), the continuous series
degrade in this order, and never the fault path (events, the fingerprint, the workload, the
other sources' faults and the snapshots' commits):

1. coarser: while a ring holds more than ``coarse_at`` of its size unread (worst ring), ``coarse``
   is set: the writer stores one step row per engine per 0.1 s and counts the rest
   (``steps_thinned``); the rings, and so the snapshots, keep every step read;
2. a gap: past ``skip_at`` unread (half-way to the writer overwriting it), the ring's step
   records (``S``, ``R``) are dropped unread until it is back under ``coarse_at``; every other
   record is still decoded. Each such stretch is counted (``gaps``, ``gap_bytes``:
   ``/metrics``, ``/healthz``) and stored as a warning event whose ``series_gap`` names its
   first and last dropped step's time: the stored series shows the gap between them.

A first catch-up (a full ring after a restart) is read whole, in one poll. Each poll reads about
``poll_bytes`` per ring (at most ``max_poll_records``) and no further ring once ``poll_budget_s``
has passed (the rings take turns starting a poll), so a catch-up or a starved CPU never holds
the loop long: the kernel log's faults and the commits run between polls. A ring drops steps
only when the poll before ended short of its writer's head too (the reader is bound by its
budget, not merely late after a pause).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from collector.channel import RingCorrupt, RingReader
from collector.channel.blocks import RequestRecords
from collector.channel.codec import TAG_REQS, TAG_STEP
from collector.channel.naming import parse_ring_file_name
from collector.channel.reads import decode_read
from collector.channel.ringfile import RingRecords
from collector.channel.secure import ensure_private_dir
from collector.model import (
    Event,
    EventKind,
    GpuSample,
    Observation,
    Severity,
    SourceStatus,
    StepHalves,
    StepRecord,
    WorkloadBatch,
)
from collector.sources.base import BatchSink, Sink
from collector.sources.join import EngineJoin, Joined
from collector.ticks import sleep_to_tick

log = logging.getLogger(__name__)

# When the sidecar cannot keep up (shares of a ring written and not yet read, worst ring):
COARSE_AT = 0.125  # the continuous series get coarser (the stored step rows are thinned)
SKIP_AT = 0.5  # the step records are dropped unread until the ring is back under COARSE_AT: a counted gap
MAX_POLL_RECORDS = 4096  # per ring and poll: a catch-up never holds the loop for long
POLL_BYTES = 4 << 20  # about this much per ring and poll (a ring is 16 MiB by default)
_WHOLE = 1 << 30
POLL_BUDGET_S = 0.02  # a poll reads no further ring after this long: the loop's other work first
_STEP_TAGS = (TAG_STEP, TAG_REQS)  # the continuous series' records; both start <Qd: step, ts
_TS = struct.Struct("<d")
_STEP_HEAD_LEN = 17
# a ring no longer read (replaced, gone, forgotten) stays readable by its blocks this long: the
# death of a replaced ring is captured from them, at once (the capture copies them out)
RELEASE_AFTER_S = 60.0


@functools.cache
def _emits_many(kind: type) -> bool:
    """Whether a sink of this type takes a batch (``BatchSink``)."""
    return callable(getattr(kind, "emit_many", None))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Tail:
    reader: RingReader
    engine: str | None = None
    role: str = "unknown"
    pid: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    joined: Joined | None = None
    held: list[Observation] = field(default_factory=list)  # records waiting for the join
    first_seen: float = field(default_factory=time.time)
    last_data: float = field(default_factory=time.time)
    last_head: int = -1
    silent_reported: bool = False
    bad_records: int = 0
    newest_ts: float = 0.0
    caught_up_at: float = field(default_factory=time.time)  # when we last read up to the writer's head
    caught_up_once: bool = False  # a first catch-up (a full ring after a restart) is never skipped
    short_last: bool = False  # the last poll ended short of the writer's head
    record_bytes: float = 256.0  # the ring's mean record size (sets how many one poll reads)
    skipping: bool = False  # far behind the writer: step records are dropped unread (a gap)
    gap_from: float | None = None  # the first and last dropped step's time
    gap_to: float | None = None
    gap_records: int = 0
    gap_bytes: int = 0
    run: int = 0
    generation: int = 0  # rings this path held before this one (a writer started again under the same name)
    replace_checked: float = 0.0  # when the path was last checked for a replaced ring
    last_read: float = -math.inf  # (monotonic) when its records were last read
    # its R records' decoder: the running set a record that keeps it refers to (collector.channel.codec)
    requests: RequestRecords = field(default_factory=RequestRecords)


class RecorderSource:
    """``join`` maps a recorder's engine name and meta record to the sidecar's engine name
    (``collector.sources.join.EngineJoin``). A ring that does not join a configured engine yet
    (its API server has not bound its port) holds its records for up to ``join_wait`` seconds
    while a configured engine still lacks a recorder, so the engine's first records (the
    fingerprint) land under the right name; after that it is shown as an engine nobody
    configured."""

    name = "recorder"

    def __init__(
        self,
        directory: Path,
        *,
        poll_interval: float = 0.1,
        read_every: float = 0.0,
        silent_after: float = 1.0,
        join: EngineJoin | None = None,
        join_wait: float = 120.0,
        alive: Callable[[int], bool] = pid_alive,
        clock: Callable[[], float] = time.time,
        keep_dead_for: float = 3600.0,
        recent_window: float = 300.0,
        max_held: int = 50_000,
        replace_check_s: float = 1.0,
        coarse_at: float = COARSE_AT,
        skip_at: float = SKIP_AT,
        max_poll_records: int = MAX_POLL_RECORDS,
        poll_bytes: int = POLL_BYTES,
        poll_budget_s: float = POLL_BUDGET_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < coarse_at < skip_at <= 1:
            raise ValueError("need 0 < coarse_at < skip_at <= 1 (shares of a ring unread)")
        self.directory = Path(directory)
        self.poll_interval = poll_interval
        self.read_every = read_every
        self._everything = False  # this poll reads every ring now (a capture's read)
        self.silent_after = silent_after
        self.join = join or EngineJoin([])
        self.join_wait = join_wait
        self.alive = alive
        self.clock = clock
        self.keep_dead_for = keep_dead_for
        self.recent_window = recent_window
        self.max_held = max_held
        self.replace_check_s = replace_check_s
        self.replaced = 0  # rings found replaced under their name (an engine started again)
        self._tails: dict[Path, _Tail] = {}
        self._paths: dict[str, Path] = {}
        self._status = SourceStatus(name=self.name, up=True)
        # records of rings no longer read, which blocks may still hold, closed once due
        self._releasing: deque[tuple[float, RingRecords]] = deque()
        self._bad_header_logged: set[Path] = set()
        self._forgotten: set[Path] = set()  # rings of departed engines: not read again while they exist
        self.records = 0  # records emitted
        self.bad_records = 0  # records set aside (bad CRC counted by the reader, bad body here)
        self.lost_bytes = 0  # bytes the writers overwrote before we read them (we fell behind)
        self.coarse_at = coarse_at
        self.skip_at = skip_at
        self.max_poll_records = max_poll_records
        self.poll_bytes = poll_bytes
        self.poll_budget_s = poll_budget_s
        self.monotonic = monotonic
        self._deadline = float("inf")
        self._polls = 0
        self.coarse = False  # the continuous series are coarser now (the module docstring)
        self.gaps = 0  # stretches of a ring's step records dropped unread (closed ones)
        self.gap_bytes = 0  # their bytes
        self.backlog = 0.0  # the worst ring's unread share at the last poll
        self._worst = 0.0

    def status(self) -> list[SourceStatus]:
        self._status.details = self.figures()
        return [self._status]

    def figures(self) -> dict[str, Any]:
        now = self.clock()
        # lag: how long since each ring was last read up to its writer's head (an idle engine
        # that writes nothing is not lag; records waiting for us are)
        lag = [now - t.caught_up_at for t in self._tails.values()]
        return {
            "rings": len(self._tails),
            "records": self.records,
            "bad_records": self.bad_records + sum(t.reader.corrupt_records for t in self._tails.values()),
            "lost_bytes": self.lost_bytes + sum(t.reader.lost_bytes for t in self._tails.values()),
            "lag_s": round(max(lag), 3) if lag else None,
            "backlog": round(self.backlog, 4),
            "coarse": int(self.coarse),
            "gaps": self.gaps,
            "gap_bytes": self.gap_bytes,
            # R records that kept a running set not read (a ring read from its middle, or records lost)
            "requests_set_aside": sum(t.requests.set_aside for t in self._tails.values()),
            "replaced": self.replaced,
            "engines": sorted({t.engine for t in self._tails.values() if t.engine}),
            "unconfigured": sorted({t.engine for t in self._tails.values() if t.engine and t.joined is not None and not t.joined.configured}),
            # how each engine's rings joined it: name, pod (its UID), port, listener, none
            "joined_by": {t.engine: t.joined.how for t in self._tails.values() if t.engine and t.joined is not None},
        }

    def joined_engines(self) -> set[str]:
        return {t.engine for t in self._tails.values() if t.engine and t.joined is not None and t.joined.configured}

    async def run(self, sink: Sink) -> None:
        # 0700, and refused (the supervisor reports it) when another user made it: injected
        # records there would become stored steps and snapshots
        ensure_private_dir(self.directory)
        while True:
            self.poll(sink)
            await sleep_to_tick(self.poll_interval)

    def poll(self, sink: Sink, *, everything: bool = False) -> int:
        """One pass over the folder; returns the number of records emitted.

        Every ring's header is looked at (a writer gone is seen within a poll), but a ring's
        records are read only once it has ``read_every`` seconds' worth or
        ``poll_bytes`` unread, or when ``everything`` is set (a snapshot's capture reads what
        the engines wrote up to now): a read of a few steps costs as much as one of dozens.

        The records of every ring are gathered first and then handed on in one pass: each
        ring read's steps as one ``StepHalves`` (columns; ingest's window merges the two halves
        of a step, from two rings, whichever comes first). Events are handed on after the
        records."""
        try:
            # one Path per file, kept: a fresh glob's Paths were hashed anew every poll
            with os.scandir(self.directory) as entries:
                names = sorted(e.name for e in entries if e.name.endswith(".ring") and not e.name.startswith("."))
            paths = [self._paths.get(n) or self._paths.setdefault(n, self.directory / n) for n in names]
        except OSError as exc:
            self._status.up, self._status.reason = False, f"cannot list {self.directory}: {exc}"
            return 0
        batch: list[Observation] = []
        emitted = 0
        self._worst = 0.0
        self._deadline = self.monotonic() + self.poll_budget_s
        self._everything = everything
        # the rings in turn start the poll: under a budget that runs out, none is always last
        self._polls += 1
        k = self._polls % len(paths) if paths else 0
        for path in paths[k:] + paths[:k]:
            tail = self._tails.get(path)
            if tail is None:
                if path in self._forgotten:
                    continue
                tail = self._open(path)
                if tail is None:
                    continue
            emitted += self._drain(path, tail, batch)
            if self._was_replaced(tail):
                tail = self._follow_replacement(path, tail, batch)
                if tail is not None:
                    emitted += self._drain(path, tail, batch)
        present = set(paths)
        for path in [p for p in self._tails if p not in present]:
            self._let_go(self._tails.pop(path).reader)
        self._release_due()
        if len(self._paths) > len(present):
            self._paths = {p.name: p for p in paths}
        self._bad_header_logged &= present
        self._forgotten &= present
        self.backlog = self._worst
        self.coarse = self._worst >= self.coarse_at
        self._status.up, self._status.reason, self._status.last_ok = True, "", self.clock()
        # Events last: one may be a trigger whose capture reads the rings again (the
        # committer's read before a capture), and the records read with it must be in by then.
        events: list[Observation] = []
        data: list[Observation] = []
        for obs in batch:
            (events if type(obs) is Event else data).append(obs)
        # the hub: a poll's steps filed per engine, not one by one. (Asked of the sink's type
        # once: an isinstance of a runtime Protocol walks its members each time, 10 us.)
        if _emits_many(type(sink)):
            cast("BatchSink", sink).emit_many(data)
        else:
            for obs in data:
                sink.emit(obs)
        for obs in events:
            sink.emit(obs)
        return emitted

    def forget(self, engine: str) -> None:
        """A departed engine (``collector.ingest.departures``): its rings' readers are closed, and
        its files, while they are left in the folder, are not read again."""
        for path in [p for p, t in self._tails.items() if t.engine == engine]:
            self._let_go(self._tails.pop(path).reader)
            self._forgotten.add(path)

    def _open(self, path: Path, generation: int = 0) -> _Tail | None:
        try:
            tail = _Tail(RingReader(path), last_data=self.clock(), first_seen=self.clock(), generation=generation)
        except RingCorrupt as exc:
            if path not in self._bad_header_logged:  # once per file, not every poll
                self._bad_header_logged.add(path)
                log.warning("skipping %s: %s", path.name, exc)
            return None
        # The file name names the writer until its meta record is read (a ring that
        # wrapped may hold records written before the last copy of that record).
        parsed = parse_ring_file_name(path.name)
        if parsed is not None:
            tail.engine = parsed.engine
            tail.role = parsed.role
            if parsed.run is not None:
                tail.run = parsed.run
        self._tails[path] = tail
        return tail

    def _was_replaced(self, tail: _Tail) -> bool:
        """Whether a writer started again under this ring's name (a recorder before the run id in
        the name, whose pids repeat: a container's, a simulator's). Checked only while the ring is
        quiet (a replaced ring's old file has no writer), at most every ``replace_check_s``: one
        stat of the path."""
        now = self.clock()
        if now - tail.last_data < self.replace_check_s or now - tail.replace_checked < self.replace_check_s:
            return False
        tail.replace_checked = now
        return tail.reader.replaced()

    def _follow_replacement(self, path: Path, old: _Tail, batch: list[Observation]) -> _Tail | None:
        """The ring under ``path`` is a new writer's: the old run ends (its death reported, once,
        as its writer is gone from this name) and the new ring is read from its first record, as
        the next run (``collector.ingest.runs``; a run id of the recorder's own in its meta, else
        the server pid with this path's generation above it)."""
        self.replaced += 1
        log.warning("recorder ring %s was replaced by a new writer (the engine started again): following the new run", path.name)
        now = self.clock()
        if not old.silent_reported and old.engine is not None and old.last_head > 0 and self._resolve(old, now, wait=False):
            old.silent_reported = True
            if now - old.newest_ts <= self.recent_window:
                batch.append(self._silent(path, old, old.reader.writer_pid, old.last_head, now, ended_by="replaced"))
        self._let_go(old.reader)
        del self._tails[path]
        return self._open(path, generation=old.generation + 1)

    def _silent(self, path: Path, tail: _Tail, pid: int, head: int, now: float, *, ended_by: str = "gone") -> Event:
        """The death of a ring's writer, as a trigger: the snapshot it freezes holds that ring's
        run (``data["run"]``), even once the engine's next run is being read."""
        how = "its process is gone" if ended_by == "gone" else "a new process of the engine replaced its ring"
        # One death, one id: a sidecar restarted within the window reads the same dead ring again
        # and reports the same event, which the store already holds (snapshots are idempotent on
        # their trigger's id); a replaced ring's generation keeps its runs' deaths apart.
        key = f"recorder_silent:{path.name}:{pid}:{head}" + (f":{tail.generation}" if tail.generation else "")
        return Event(
            kind=EventKind.RECORDER_SILENT,
            ts=now,
            source="recorder",
            severity=Severity.CRITICAL,
            engine=tail.engine,
            pid=pid,
            process=tail.role,
            message=f"recorder channel of {tail.engine} ({tail.role}, pid {pid}) went silent and {how}",
            data={"ring": path.name, "last_data_ts": tail.last_data, "run": tail.run},
            uid=hashlib.sha1(key.encode()).hexdigest(),
        )

    def _resolve(self, tail: _Tail, now: float, *, wait: bool = True) -> bool:
        """Join the ring to an engine; False while it should wait for its engine's port (never
        when ``wait`` is False: its writer is gone, nothing more will come to join it by)."""
        if tail.joined is not None:
            return True
        own = str(tail.meta.get("engine") or tail.engine or "unknown")
        joined = self.join.resolve(own, tail.meta)
        if not joined.configured:
            waiting_for = self.join.names - self.joined_engines()
            if wait and waiting_for and self.join.targets and now - tail.first_seen < self.join_wait and len(tail.held) < self.max_held:
                return False
            log.warning(
                "recorder ring %s (engine %s) matches no configured engine: its steps are kept as engine %r; "
                "set FLIGHTREC_ENGINE_NAME in that engine's environment, or add its URL to engines:",
                tail.reader.path.name,
                own,
                own,
            )
        tail.joined = joined
        tail.engine = joined.name
        return True

    def _drop_steps(self, path: Path, tail: _Tail, payloads: list[memoryview], places: list[int]) -> tuple[list[memoryview], list[int]]:
        """While a ring is far behind its writer, its step records (``S`` and ``R``: the
        continuous series) are counted and dropped unread; every other record (events, the
        fingerprint, meta, the workload) is still decoded: the fault path keeps all of its.
        Returns the records kept and their places."""
        kept = []
        kept_at = []
        for p, at in zip(payloads, places, strict=True):
            if p[:1] in _STEP_TAGS and len(p) >= _STEP_HEAD_LEN:
                ts = _TS.unpack_from(p, 9)[0]
                if tail.gap_from is None:
                    tail.gap_from = ts
                tail.gap_to = ts
                tail.gap_records += 1
                tail.gap_bytes += len(p)
            else:
                kept.append(p)
                kept_at.append(at)
        return kept, kept_at

    def _gap_closed(self, path: Path, tail: _Tail, now: float) -> Event:
        """The end of a stretch of dropped steps: counted, logged once, and stored as an event
        (the stored step series shows the gap between its two times)."""
        self.gaps += 1
        self.gap_bytes += tail.gap_bytes
        gap = {"ring": path.name, "from_ts": tail.gap_from, "to_ts": tail.gap_to, "records": tail.gap_records, "bytes": tail.gap_bytes}
        log.warning("ring %s: the sidecar fell behind its writer and dropped %d step records unread", path.name, tail.gap_records)
        tail.skipping, tail.gap_from, tail.gap_to, tail.gap_records, tail.gap_bytes = False, None, None, 0, 0
        return Event(
            kind=EventKind.LOG,
            ts=now,
            source="recorder",
            severity=Severity.WARNING,
            engine=tail.engine if tail.joined is not None else None,
            process=tail.role,
            message=(
                f"recorder ring {path.name}: the sidecar fell behind and dropped {gap['records']} step records unread: "
                "a gap in this engine's step series"
            ),
            data={"series_gap": gap},
        )

    def _drain(self, path: Path, tail: _Tail, batch: list[Observation]) -> int:
        """Read one ring into ``batch`` (in order; a death reported after its records); returns
        the number of records it added."""
        now = self.clock()
        gap: Event | None = None
        try:
            info = tail.reader.info()
            unread = info.head - max(tail.reader.pos, info.tail)
            first = not tail.caught_up_once  # a first catch-up is read whole, as one poll
            mono = self.monotonic()
            if (
                unread > 0
                and not first
                and not self._everything
                and not tail.skipping
                # (a small ring is read before its writer can lap it, or its backlog turn coarse)
                and unread < min(self.poll_bytes, self.coarse_at * info.capacity / 2)
                and mono - tail.last_read < self.read_every
                and (info.head != tail.last_head or self.alive(info.pid))
            ):
                # not yet: too few records to be worth a read. The writer is alive (its head
                # moved, or its pid is there): a writer gone has its last records read now.
                if info.capacity:
                    self._worst = max(self._worst, unread / info.capacity)
                if info.head != tail.last_head:
                    tail.last_data, tail.last_head = now, info.head
                return 0
            # this poll's time is spent: next poll (a capture's read reads on: its snapshot
            # must hold every ring up to its writer's head)
            if not first and not self._everything and mono > self._deadline:
                tail.short_last = unread > 0
                if info.capacity:
                    self._worst = max(self._worst, unread / info.capacity)
                return 0
            tail.last_read = mono
            if tail.caught_up_once and tail.short_last and unread > self.skip_at * info.capacity:
                tail.skipping = True
            # (the first catch-up whole: the engines' fingerprints, which map a fault's pid to its
            # engine, must be in before the kernel log's first fault is)
            budget = _WHOLE if first else max(16, min(self.max_poll_records, int(self.poll_bytes / tail.record_bytes)))
            places: list[int] = []
            payloads = tail.reader.read_views(budget, places=places)
            tail.requests.capacity = info.capacity  # (a break in the records, by their places, drops its running set)
            unread = info.head - tail.reader.pos
            tail.short_last = unread > 0
            if payloads:
                mean = sum(map(len, payloads)) / len(payloads)
                tail.record_bytes = 0.8 * tail.record_bytes + 0.2 * max(mean, 16.0)
        except (RingCorrupt, ValueError, OSError) as exc:
            if path not in self._bad_header_logged:
                self._bad_header_logged.add(path)
                log.warning("ring %s unreadable: %s", path.name, exc)
            return 0
        tail.pid = info.pid
        if tail.skipping:
            payloads, places = self._drop_steps(path, tail, payloads, places)
            tail.requests.reset()  # (a full R record may be among those dropped)
            if unread <= self.coarse_at * info.capacity:
                gap = self._gap_closed(path, tail, now)
        if tail.reader.pos >= info.head:
            tail.caught_up_at, tail.caught_up_once = now, True
        if info.capacity:
            self._worst = max(self._worst, unread / info.capacity)
        out = tail.held
        # the per-request records are kept as their place in the ring (its bytes stay there)
        read = decode_read(payloads, records=lambda: self._records_of(tail), places=places, requests=tail.requests)
        if read.bad_steps:
            tail.bad_records += read.bad_steps
            self.bad_records += read.bad_steps
            self._status.errors += read.bad_steps
        for meta, obs, error in read.other:
            if error is not None:
                tail.bad_records += 1
                self.bad_records += 1
                self._status.errors += 1
                log.debug("bad record in %s: %s", path, error)
                continue
            if meta is not None:
                tail.meta = meta
                tail.role = str(meta.get("role", tail.role))
                tail.run = self._run_of(meta, tail, info.pid)
                continue
            assert obs is not None
            out.append(obs)
        if read.stats is not None or read.blocks:
            out.append(StepHalves("", 0, read.stats, read.extras, tuple(read.blocks)))
        emitted = 0
        # (a joined ring needs no liveness check: one kill(0) per ring and poll was 3% of the
        # sidecar's samples at 8 engines)
        if out and (tail.joined is not None or self._resolve(tail, now, wait=self.alive(info.pid))):
            engine = tail.engine or "unknown"
            run = tail.run or info.pid + (tail.generation << 32)
            emitted = len(out)
            for i, obs in enumerate(out):
                if type(obs) is StepHalves:
                    out[i] = obs = replace(obs, engine=engine, run=run)
                    emitted += obs.count - 1
                    stats = obs.stats
                    newest = float(stats["ts"].max()) if stats is not None else 0.0
                    if obs.blocks:
                        newest = max(newest, max(b.ts for b in obs.blocks))
                    if newest > tail.newest_ts:
                        tail.newest_ts = newest
                    continue
                if isinstance(obs, StepRecord):  # (a JSON step: none are written today)
                    out[i] = obs = replace(obs, engine=engine, run=run)
                elif isinstance(obs, Event):
                    obs.engine = engine
                elif not isinstance(obs, GpuSample):  # (the channel never carries GPU samples)
                    # the frozen records (a workload batch a read, a fingerprint): one made with
                    # the engine's name, once per read
                    out[i] = obs = replace(obs, engine=engine)
                if type(obs) is WorkloadBatch:  # one observation, a record each request's arrival or end
                    emitted += len(obs.records) - 1
                ts = getattr(obs, "ts", 0.0)
                if isinstance(ts, float) and ts > tail.newest_ts:
                    tail.newest_ts = ts
            batch.extend(out)
            self.records += emitted
            tail.held = []
        if gap is not None:
            batch.append(gap)
        if payloads or info.head != tail.last_head:
            tail.last_data, tail.last_head = now, info.head
        elif (
            not tail.silent_reported
            and now - tail.last_data >= self.silent_after
            and not self.alive(info.pid)
            and tail.engine is not None
            and self._resolve(tail, now, wait=False)
        ):
            tail.silent_reported = True
            # A death is news if the writer wrote recently: a ring left by an engine that died
            # long before this sidecar started is history (its records still fill the ring).
            if now - tail.newest_ts <= self.recent_window:
                batch.append(self._silent(path, tail, info.pid, info.head, now))
        if tail.silent_reported and now - tail.last_data > self.keep_dead_for:
            try:
                path.unlink()
            except OSError:
                pass
            else:  # its blocks let go of the file too: its space in the tmpfs goes with its name
                self._let_go(tail.reader, now=True)
        return emitted

    @staticmethod
    def _records_of(tail: _Tail) -> RingRecords | None:
        try:
            return tail.reader.records()
        except OSError as exc:  # (no descriptor left): its request records are copied, as before
            log.debug("ring %s: its records cannot be read again by place: %s", tail.reader.path.name, exc)
            return None

    def _let_go(self, reader: RingReader, *, now: bool = False) -> None:
        """Close a reader; the records it lent to blocks stay readable ``RELEASE_AFTER_S`` more
        (a replaced ring's death is captured from them), or none more (``now``: a ring deleted)."""
        records = reader.release()
        if records is None:
            return
        if now:
            records.close()
        else:
            self._releasing.append((self.monotonic() + RELEASE_AFTER_S, records))

    def _release_due(self) -> None:
        while self._releasing and self._releasing[0][0] <= self.monotonic():
            self._releasing.popleft()[1].close()

    @staticmethod
    def _run_of(meta: dict[str, Any], tail: _Tail, pid: int) -> int:
        """The ring's run id: the recorder's own (``run`` in its meta record), else (a recorder
        before the run id) its server pid, with the path's generation above the pid's 32 bits so
        a ring replaced under the same name is another run."""
        run = meta.get("run")
        if type(run) is int and run > 0:
            return run
        server = meta.get("server_pid")
        base = server if type(server) is int and server > 0 else tail.run % (1 << 32) or pid
        return base + (tail.generation << 32)
