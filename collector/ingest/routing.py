"""Event routing: every event gets its id, the kernel's and NVML's reports of one Xid become one
event, and each event is filed with the engines it belongs to and passed to the consumers
given at construction (the trigger policy, then the alert router).

A second witness of an Xid is merged into a new event under the first one's id
(``collector.xid.merge``): the rings and the writer's queue replace the one they hold, and the
consumers get it as not new, to replace theirs. No event is changed once filed.

Events are handled one at a time, in arrival order: an event filed while one is being handed
out (a consumer that reads the recorder before it captures, which may find a dead ring) waits
its turn in ingest's queue (``Intake.next_event``) instead of re-entering the consumers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

from collector.ingest.engines import EngineRegistry
from collector.ingest.intake import Intake
from collector.ingest.store import WindowStore
from collector.ingest.view import Route
from collector.model import CRASH_KINDS, Event, EventKind

log = logging.getLogger(__name__)

EventConsumer = Callable[[Event, bool], None]  # (event, is_new)

GPU_FAULTS = (EventKind.XID, EventKind.GPU_LOST)


def route(ev: Event, engines: EngineRegistry, store: WindowStore) -> Route:
    """The engines an event belongs to, and how that was decided."""
    if ev.engine is not None:
        return Route((ev.engine,), "engine")
    if ev.kind not in GPU_FAULTS:
        return Route((), "none")
    # A GPU fault belongs to the engine whose worker it names (pid= in the kernel's line,
    # walked up the process tree, or in Kubernetes the engines of the pod its cgroup names), else to the engines on that GPU (configured, or learnt
    # from NVML's process lists), else to every engine on this host (better a snapshot
    # too many than none).
    owners = engines.owners_of(ev.pid)
    if owners:
        return Route(owners, "pid")
    index = store.gpu_index(ev.gpu)
    names = engines.names()
    mapped = tuple(n for n in names if index in engines.gpus_of(n))
    if mapped:
        return Route(mapped, "gpu")
    return Route(tuple(n for n in names if not engines.gpus_of(n) or index is None), "all")


class EventRouter:
    def __init__(self, intake: Intake, *, consumers: Sequence[EventConsumer] = ()) -> None:
        self.intake = intake
        self.consumers = tuple(consumers)
        self._busy = False

    def drain(self) -> None:
        """Route the events waiting, oldest first; a no-op while one is being routed."""
        if self._busy:
            return
        self._busy = True
        try:
            while (ev := self.intake.next_event()) is not None:
                try:
                    self._route(ev)
                except Exception:  # a bad event must never stop the ones behind it
                    self.intake.set_aside(ev)
        finally:
            self._busy = False

    def _route(self, ev: Event) -> None:
        intake = self.intake
        if not ev.uid:
            ev.uid = uuid.uuid4().hex  # before it is filed: its id is part of what ingest accepted
        is_new = True
        if ev.kind in GPU_FAULTS:
            if "gpu_holders" not in ev.data:  # the pods the kubelet gave that GPU, for the page
                holders = intake.holders_of(ev.gpu)
                if holders:
                    ev.data["gpu_holders"] = holders
            ev, is_new = intake.xid.offer(ev)
            if is_new and ev.xid is not None:
                key = (ev.gpu or "unknown", ev.xid)
                intake.xid_counts[key] = intake.xid_counts.get(key, 0) + 1
        if ev.kind is EventKind.ENGINE_DOWN and ev.engine:
            intake.engine(ev.engine)
            intake.engines.went_down(ev.engine)
        if is_new:
            intake.rows.offer_event(ev)
        else:
            intake.rows.amend_event(ev)
        targets = route(ev, intake.engines, intake.store)
        for name in targets.engines:
            intake.engine(name)
            intake.engines.saw_event(name, ev)  # a wedge, its end, a crash, a GPU fault: the engine's state
        if is_new:
            intake.store.add_event(ev, targets.engines)
            if ev.kind in CRASH_KINDS:  # the engines died: their workload logs close what was open
                for name in targets.engines:
                    intake.store.of(name).workload.died(ev.ts)
        else:
            intake.store.replace_event(ev)
        for consumer in self.consumers:
            try:
                consumer(ev, is_new)
            except Exception:
                log.exception("event consumer failed")
