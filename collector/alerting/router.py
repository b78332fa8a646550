"""Connects the sidecar to Alertmanager: events and detector transitions become alerts.

Ordering rule: an alert about a snapshot goes out only after that snapshot is committed, so
the link it carries always opens. A trigger that starts a snapshot is held until the commit
(milliseconds); a late witness of a fault whose snapshot is already committed pages at once
with that snapshot's link; everything else pages at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from collector.alerting.alertmanager import AlertmanagerClient
from collector.alerting.alerts import Alert, alert_for_event, alerts_for_transition, crash_alert
from collector.alerting.config import AlertingSettings
from collector.detectors.base import Transition
from collector.model import CRASH_KINDS, ENGINE_ERROR_KINDS, Event, EventKind, GpuSample
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.freeze import is_trigger

log = logging.getLogger(__name__)


class AlerterConfig(Protocol):
    """What the router reads of the settings (``collector.settings.Settings`` fits)."""

    @property
    def alerting(self) -> AlertingSettings: ...

    @property
    def alertmanager(self) -> Sequence[str]: ...

    @property
    def public_url(self) -> str | None: ...

    @property
    def host(self) -> str: ...


class Alerter:
    """The alert router: consumes ingest's events, the detector task's transitions and the
    committer's commits; calls nothing upstream. ``snapshots_for`` is the committer's
    read-only query of which snapshot holds an event."""

    def __init__(
        self,
        settings: AlerterConfig,
        *,
        host: str,
        snapshots_for: Callable[[Event], dict[str, int | None]],
        engine_up: Callable[[str], bool | None],
        port: Callable[[], int],
        client: AlertmanagerClient | None = None,
        hold_max_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        gpus: Callable[[], Iterable[GpuSample]] | None = None,
    ) -> None:
        s = settings
        a = s.alerting
        self.settings = s
        self.client = client or AlertmanagerClient(
            s.alertmanager,
            resend_interval=a.resend_interval,
            resolved_resend_for=a.resolved_resend_for,
            batch_max=a.batch_max,
            queue_max=a.queue_max,
            backoff_min=a.backoff_min,
            backoff_max=a.backoff_max,
            timeout=a.timeout,
        )
        self.host = a.host or host
        self.runbook_base = a.runbook_base
        self.hold = a.event_hold
        self.snapshots_for = snapshots_for
        self.engine_up = engine_up
        self.port = port
        # a trigger waits for its snapshot's commit, at most this long (a database that is down
        # must not delay the page: it goes out without the link)
        self.hold_max_s = hold_max_s
        self.clock = clock
        # the hub's last GPU samples: alerts name a GPU as dcgm-exporter and our /metrics do
        # (index, UUID, PCI bus id); without them only what the event itself says
        self.gpus = gpus or (lambda: ())
        self._held: dict[str, list[tuple[float, Event]]] = {}  # engine -> triggers waiting for a commit
        self._down: dict[str, Alert] = {}
        self._wedged: dict[str, Alert] = {}  # engine -> its VllmEngineWedged, resolved when it steps again

    @property
    def public_url(self) -> str:
        s = self.settings
        if s.public_url:
            return s.public_url.rstrip("/")
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host
        return f"http://{host}:{self.port()}"

    def stats(self) -> dict[str, int]:
        st = self.client.stats()
        return {"sent": st.sent, "failed": st.failed, "dropped": st.dropped}

    def _alert(self, ev: Event, snapshot_id: int | None = None) -> Alert | None:
        return alert_for_event(
            ev, host=self.host, public_url=self.public_url, snapshot_id=snapshot_id, runbook_base=self.runbook_base, hold=self.hold, gpus=self.gpus()
        )

    def _fire(self, ev: Event, snapshot_id: int | None = None) -> None:
        alert = self._alert(ev, snapshot_id)
        if alert is None:
            return
        self.client.fire(alert)
        if ev.kind is EventKind.ENGINE_DOWN and ev.engine:
            self._down[ev.engine] = alert
        if ev.kind is EventKind.ENGINE_WEDGED and ev.engine:
            self._wedged[ev.engine] = alert

    # Ingest consumer: runs on the loop, after the trigger policy has opened any snapshot.
    def on_event(self, ev: Event, is_new: bool) -> None:
        if not is_new:  # a second witness merged into an Xid: a held alert pages the merged event
            for name, waiting in self._held.items():
                self._held[name] = [(since, ev if e.uid == ev.uid else e) for since, e in waiting]
            return
        if ev.kind is EventKind.ANOMALY:
            return  # anomalies page through their detector transitions
        if ev.kind is EventKind.ENGINE_RESUMED and ev.engine:
            self._resolve_wedge(ev.engine)  # it steps again: the wedge's page resolves
            return
        if not is_trigger(ev):
            self._fire(ev)
            return
        targets = self.snapshots_for(ev)
        if not targets:
            self._fire(ev)  # no snapshot for it (e.g. an engine never seen up)
            return
        for name, snapshot_id in targets.items():
            if snapshot_id is not None:
                self._fire(ev, snapshot_id)
            else:
                self._held.setdefault(name, []).append((self.clock(), ev))

    def on_transition(self, tr: Transition) -> None:
        fire, resolve = alerts_for_transition(tr, host=self.host, public_url=self.public_url, runbook_base=self.runbook_base, gpus=self.gpus())
        if resolve is not None:
            self.client.resolve(resolve)
        if fire is not None:
            self.client.fire(fire)

    def snapshot_committed(self, doc: SnapshotDoc, trigger: Event) -> None:
        if trigger.kind in CRASH_KINDS and trigger.kind not in ENGINE_ERROR_KINDS and doc.engine:
            # a crash snapshot opened by another fault (the Xid before the CUDA error, a lost
            # GPU, a silent recorder) is the engine's crash too: the engine's own error, if it
            # comes, refreshes this same alert
            self.client.fire(
                crash_alert(
                    trigger,
                    engine=doc.engine,
                    host=self.host,
                    public_url=self.public_url,
                    snapshot_id=doc.id,
                    runbook_base=self.runbook_base,
                    hold=self.hold,
                )
            )
        waiting = self._held.pop(doc.engine, [])
        keep = []
        for since, ev in waiting:
            sid = self.snapshots_for(ev).get(doc.engine)
            if sid is not None:
                self._fire(ev, sid)
            else:
                keep.append((since, ev))
        if keep:
            self._held[doc.engine] = keep

    async def run(self) -> None:
        sender = asyncio.create_task(self.client.run(), name="alertmanager-client")
        try:
            while True:
                await asyncio.sleep(0.25)
                self.tick()
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    def tick(self) -> None:
        now = self.clock()
        for name, waiting in list(self._held.items()):
            late = [(s, ev) for s, ev in waiting if now - s >= self.hold_max_s]
            if late:
                for _, ev in late:
                    self._fire(ev, None)
                self._held[name] = [(s, ev) for s, ev in waiting if now - s < self.hold_max_s]
        for name, alert in list(self._down.items()):
            if self.engine_up(name):
                self.client.resolve(alert.key)
                del self._down[name]
        for name in list(self._wedged):
            if self.engine_up(name) is False:  # a wedge that ends in the engine's death: its crash or down page says so
                self._resolve_wedge(name)

    def _resolve_wedge(self, engine: str) -> None:
        held = self._held.get(engine)
        if held:  # a wedge whose snapshot has not committed yet: it is over before it paged
            self._held[engine] = [(s, e) for s, e in held if e.kind is not EventKind.ENGINE_WEDGED]
        alert = self._wedged.pop(engine, None)
        if alert is None:  # paged before its snapshot's commit, or not at all: its label set is the same
            alert = self._alert(Event(kind=EventKind.ENGINE_WEDGED, ts=self.clock(), source="detector", message="", engine=engine))
        if alert is not None:
            self.client.resolve(alert.key)

    async def aclose(self) -> None:
        await self.client.aclose()
