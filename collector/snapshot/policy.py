"""The trigger policy: which events open a snapshot of which engines, on the event loop.

A trigger (``freeze.is_trigger``) opens a snapshot of each engine it is routed to
(``IngestView.route``). Before anything else the trigger is made durable: its intent (a small
fsynced file in the spool folder) is written, one per engine, before any capture, spool or
database write and before a manual request is answered. Then the recorder is read once
(``read_now``: what the engines published and the sidecar has not polled yet) and every
engine's rings are captured at once (``freeze.capture``: references only, milliseconds), so
what a snapshot holds is what the rings held at the fault, however late the commit. The
snapshots one trigger opens go to the commit queue as one batch: they become durable together,
in one transaction (a node-wide Xid that matches no engine opens one per engine).

One fault seen by several witnesses is one snapshot per engine: a trigger that comes while the
engine's snapshot is open (``window_s``) joins it as late evidence. A later *distinct* fault
opens a snapshot of its own, filed in the same incident (its rings end at the second fault, and
the incident groups the two; its alert links the snapshot that holds it):
- a GPU fault on another GPU than the ones the open snapshot holds, when routed to the engine
  by its pid or its GPU (a second GPU's fault is a new fact, not late evidence of the first);
  one routed to every engine because it matches none joins as late evidence (which engine it
  hit is unknown, and a snapshot of every engine per GPU would multiply one node-wide fault);
- after the open snapshot was amended: a GPU fault with an Xid code it does not hold yet, or a
  critical anomaly of an engine that is not dead;
- a wedge (``engine_wedged``, said once per wedge), always: its snapshot is the one that reads
  the engine's stacks, whether the open one is a throughput collapse's seen the same second or
  an earlier wedge's that ended.
A manual snapshot is always its own; a manual request names one engine or, with none, every
engine.

A trigger read again at start (``data["replayed"]``: the kernel log resumes after its mark,
``collector.sources.kmsg_mark``) is captured like a retake, cut at its time plus ``settle_s``,
and not amended (what came later is not its evidence); one whose intent is on disk is left to
its retake (``recovery``).

Each snapshot is amended once, ``settle_s`` after its capture, with the evidence that arrived
late (the workers' own tracebacks, vLLM's crash dump, the last steps): the snapshots a trigger
opened are captured again at once and committed as one batch.

A wedge (``engine_wedged``) also starts reading the engine's stacks the moment it opens its
snapshot (``collector.snapshot.hang``); the first commit does not wait for them, its amendment
does (within the capture's bound) and holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from collector.ingest.view import IngestView, Route
from collector.model import CRASH_KINDS, Event, EventKind, Severity
from collector.snapshot import intent
from collector.snapshot.commit import CommitQueue, Job
from collector.snapshot.freeze import Capture, capture, cut, is_trigger
from collector.snapshot.hang import HangStacks, settle
from collector.snapshot.ledger import OpenSnapshot, SnapshotLedger
from collector.stacks.part import summary as stacks_summary

log = logging.getLogger(__name__)

DISTINCT_KINDS = frozenset({EventKind.XID, EventKind.GPU_LOST, EventKind.ANOMALY})
GPU_FAULTS = frozenset({EventKind.XID, EventKind.GPU_LOST})
# a wedge's end waits this many seconds at most for its snapshot's amendment before it is linked
RESUME_LINK_TRIES = 300


class TriggerPolicy:
    def __init__(
        self,
        view: IngestView,
        ledger: SnapshotLedger,
        queue: CommitQueue,
        *,
        settle_s: float,
        window_s: float,
        gpu_seconds: float = 300.0,
        scrape_interval: float | None = None,
        read_now: Callable[[], object] | None = None,
        stacks: HangStacks | None = None,
    ) -> None:
        self.view = view
        self.stacks = stacks  # reads a wedged engine's stacks (None: not read)
        self.ledger = ledger
        self.queue = queue
        self.spool_dir = queue.spool_dir
        self.settle_s = settle_s
        self.window_s = window_s
        self.gpu_seconds = gpu_seconds
        self.scrape_interval = scrape_interval
        # Reads what the in-engine recorder published but the sidecar has not polled yet, so a
        # capture already ends at the engine's last step (the service passes the recorders' poll).
        self.read_now = read_now
        self._timers: list[asyncio.TimerHandle] = []  # amendments due (cancelled at close)
        self._waits: set[asyncio.Future[None]] = set()  # amendments waiting for their stacks
        self._closing = False

    def _link_when_amended(self, o: OpenSnapshot, ev: Event, tries: int) -> None:
        """Links a wedge's end to its snapshot once the snapshot is committed and its amendment
        decided (the store keeps the end's note through an amendment written after it too);
        looked at once a second."""
        if o.snapshot_id is not None and o.amended:
            self.queue.link_later(ev, o.snapshot_id)
            return
        if tries <= 0 or self._closing:
            return
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(1.0, self._link_when_amended, o, ev, tries - 1))
            self._timers = [t for t in self._timers if not t.cancelled() and t.when() >= loop.time()]  # fired ones dropped

    # -- deciding (a consumer of ingest's events) ------------------------------------------------
    def on_event(self, ev: Event, is_new: bool) -> None:
        if not is_new:  # a second witness merged into an Xid: the first decided, the merged one is held
            if ev.uid:
                self.ledger.amend(ev)
            return
        if ev.kind is EventKind.ENGINE_RESUMED and ev.engine:
            # the wedge's end: its stored event joins the wedge's snapshot (and so its incident)
            o = self.ledger.opened_by(ev.engine, str(ev.data.get("wedged_uid") or ""))
            if o is not None:
                self._link_when_amended(o, ev, RESUME_LINK_TRIES)
            return
        if not is_trigger(ev):
            return
        if ev.kind is EventKind.MANUAL and ev.engine is None:
            route = Route(tuple(sorted(self.view.engine_names())), "all")
        else:
            route = self.view.route(ev)
        targets = list(route.engines)
        if ev.kind is EventKind.ENGINE_DOWN:
            # An engine never seen up has no last steps to freeze: the event (and its alert)
            # says it is down; a snapshot would be empty.
            targets = [n for n in targets if (info := self.view.engine(n)) is not None and info.ever_up]
        replayed = bool(ev.data.get("replayed"))
        if replayed:  # a trigger whose intent the killed run left is retaken from it, not opened twice
            targets = [n for n in targets if not intent.pending_for(self.spool_dir, n, ev.uid)]
        opened: list[OpenSnapshot] = []
        now = self.view.now()
        gpu = self.view.gpu_key(ev.gpu) if ev.kind in GPU_FAULTS and ev.gpu is not None else None
        for name in targets:
            cur = self.ledger.current(name)
            if gpu is not None and route.by in ("pid", "gpu"):
                # the open snapshot that holds this GPU's fault, if any: a second GPU's fault
                # took the engine's current place, and the first GPU's next report joins its own
                cur = self.ledger.holding_gpu(name, gpu, now) or cur
            if cur is not None and cur.is_open(now) and ev.kind is not EventKind.MANUAL and not self._distinct(cur, ev, gpu, route):
                cur.join(ev, gpu=gpu, now=now)  # same fault, another witness: no second snapshot
                if cur.snapshot_id is not None:
                    self.queue.link_later(ev, cur.snapshot_id)
                continue
            o = OpenSnapshot.opened(name, ev, now + self.window_s, gpu=gpu, run=self._run_of(name, ev), replayed=replayed)
            self._write_intent(o)  # first: durable before anything else (and before a POST answers)
            # the newest is the one later witnesses join, unless it is a fault's and the open one manual
            self.ledger.open(o, current=cur is None or cur.trigger.kind is not EventKind.MANUAL or ev.kind is EventKind.MANUAL)
            opened.append(o)
        if opened:
            if self.stacks is not None:  # started before the capture: the first dump is the hang's moment
                for o in opened:
                    if o.trigger.kind is EventKind.ENGINE_WEDGED and (reading := self.stacks.start(o.engine, o.trigger)) is not None:
                        o.stacks_reading(reading)
            captures = self.capture_all(opened)
            for o, cap in zip(opened, captures, strict=True):
                if o.stacks is not None and self.stacks is not None:
                    _with_stacks(cap, self.stacks.first(time.time()))
            if replayed:
                for cap in captures:
                    later = cut(cap, ev.ts + self.settle_s)
                    cap.extra["replayed"] = {
                        "steps_after_fault_left_out": later,
                        "note": "read again at start after the kernel log's mark: the sidecar had not made it durable, or was stopped"
                        + ("" if cap.steps else "; the rings no longer hold the steps before the fault"),
                    }
            self.queue.put(Job(opened, captures, amend=False))
            self._schedule_amend(opened)

    def _run_of(self, engine: str, ev: Event) -> int | None:
        """The engine's run an event is of: the one it names (a ring's death names its run), else
        the run the engine's rings hold now."""
        named = ev.data.get("run") if isinstance(ev.data, dict) else None
        return named if isinstance(named, int) else self.view.run_info(engine).run

    def _distinct(self, cur: OpenSnapshot, ev: Event, gpu: str | None, route: Route) -> bool:
        if cur.run is not None and (run := self._run_of(cur.engine, ev)) is not None and run != cur.run:
            # the engine started again since: a fault of its new run is not the old run's death
            # (a container restarted within the incident window), and never shares its snapshot
            return True
        if ev.kind is EventKind.ENGINE_WEDGED:
            # the watch says each wedge once: its own snapshot, the only kind that reads the stacks
            # (a throughput collapse seen the same second, or the wedge before it, has none of this one)
            return True
        if gpu is not None and route.by in ("pid", "gpu") and cur.gpus and gpu not in cur.gpus:
            return True  # another GPU's fault: its own snapshot
        if not cur.amended or ev.kind not in DISTINCT_KINDS:
            return False
        if ev.kind is EventKind.ANOMALY:
            # a dead engine's series look stalled: an anomaly after its death is a consequence
            dead = cur.trigger.kind in CRASH_KINDS or cur.trigger.kind is EventKind.ENGINE_DOWN
            return ev.severity is Severity.CRITICAL and not dead
        return ev.xid is None or ev.xid not in cur.xids()

    def _write_intent(self, o: OpenSnapshot) -> None:
        """One small fsynced file, on the loop: a trigger is rare and its durability is the point
        (milliseconds; ``BENCHMARKS.md``). A failure is logged and the snapshot goes on."""
        if not o.trigger.uid:
            o.trigger.uid = uuid.uuid4().hex  # a trigger that did not come through ingest (tools)
        try:
            o.intent_written(intent.write(self.spool_dir, o.engine, o.trigger, time.time()))
        except OSError as exc:
            o.intent_not_written(f"trigger not durable: {exc}")
            log.error(
                "cannot write the intent of the %s trigger of %s (%s): a kill before its snapshot is spooled loses it",
                o.trigger.kind.value,
                o.engine,
                exc,
            )

    # -- capturing ------------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Read the recorder now, so the rings end at the engines' last published step."""
        if self.read_now is None:
            return
        try:
            self.read_now()
        except Exception:  # a late read must never cost the snapshot
            log.exception("reading the recorder before a capture failed")

    def capture_all(self, opens: list[OpenSnapshot]) -> list[Capture]:
        """Every engine's rings at once, after one read of the recorder."""
        self.catch_up()
        return [self._capture(o.engine, o.trigger) for o in opens]

    def _capture(self, engine: str, trigger: Event) -> Capture:
        cap = capture(self.view, engine, trigger, gpu_seconds=self.gpu_seconds, scrape_interval=self.scrape_interval)
        if trigger.kind is EventKind.ENGINE_WEDGED and self.stacks is not None:
            _with_stacks(cap, HangStacks.retaken())  # a live snapshot's replaces it (on_event, _amend)
        return cap

    def capture_one(self, engine: str, trigger: Event) -> Capture:
        self.catch_up()
        return self._capture(engine, trigger)

    # -- amending -------------------------------------------------------------------------------
    def _schedule_amend(self, opens: list[OpenSnapshot]) -> None:
        def due(waited: bool = False) -> None:
            if self._closing:
                return
            todo = [o for o in opens if not o.amended and o.retake is None]
            reading = [o.stacks for o in todo if o.stacks is not None and not o.stacks.done()]
            if reading and not waited and self.stacks is not None:
                # the stacks are the wedge's late evidence: the amendment waits for them (bounded)
                wait = asyncio.ensure_future(settle(reading, self.stacks.bound_s + 1.0))
                self._waits.add(wait)

                def read(w: asyncio.Future[None]) -> None:
                    self._waits.discard(w)
                    due(waited=True)

                wait.add_done_callback(read)
                return
            self._amend(todo)

        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            self._timers = [t for t in self._timers if not t.cancelled() and t.when() > loop.time()]
            self._timers.append(loop.call_later(self.settle_s, due))

    def _amend(self, opens: list[OpenSnapshot], *, stopping: bool = False) -> None:
        if not opens:
            return
        for o in opens:
            o.take_amendment()  # one amendment; a distinct fault after this opens its own snapshot
        captures = self.capture_all(opens)
        for o, cap in zip(opens, captures, strict=True):
            if o.stacks is not None:
                _with_stacks(cap, HangStacks.result(o.stacks, stopping=stopping))
        self.queue.put(Job(opens, captures, amend=True))

    def amend_now(self) -> None:
        """At shutdown: the amendments not due yet are queued now, and no timer fires after (a
        wedge's stacks not read by then are said to be missing, and why)."""
        self.stop_timers()
        self._amend([o for o in self.ledger.still_open() if not o.amended and o.retake is None], stopping=True)

    def stop_timers(self) -> None:
        self._closing = True
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        for w in list(self._waits):
            w.cancel()
        self._waits.clear()


def _with_stacks(cap: Capture, stacks: dict[str, Any]) -> None:
    cap.stacks = stacks
    cap.extra["stacks"] = stacks_summary(stacks)
