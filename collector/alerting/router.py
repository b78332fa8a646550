"""Connects the sidecar to Alertmanager: events and detector transitions become alerts.

Ordering rule: an alert about a snapshot goes out only after that snapshot is committed, so
the link it carries always opens. A trigger that starts a snapshot is held until the commit
(milliseconds); a late witness of a fault whose snapshot is already committed pages at once
with that snapshot's link; everything else pages at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from collector.alerting.alertmanager import AlertmanagerClient
from collector.alerting.alerts import Alert, alert_for_event, alerts_for_transition
from collector.detectors.runner import DetectorRunner
from collector.model import Event, EventKind, Severity
from collector.snapshot.document import SnapshotDoc
from collector.snapshot.freeze import is_trigger

log = logging.getLogger(__name__)


class Alerter:
    def __init__(self, ctx: Any, *, client: AlertmanagerClient | None = None, detector_interval: float = 1.0) -> None:
        s = ctx.settings
        a = s.alerting
        self.ctx = ctx
        self.client = client or AlertmanagerClient(
            s.alertmanager, resend_interval=a.resend_interval, resolved_resend_for=a.resolved_resend_for,
            batch_max=a.batch_max, queue_max=a.queue_max, backoff_min=a.backoff_min,
            backoff_max=a.backoff_max, timeout=a.timeout,
        )  # fmt: skip
        self.host = a.host or ctx.hub.host
        self.runbook_base = a.runbook_base
        self.hold = a.event_hold
        self.runner = DetectorRunner(s.detectors, clock=ctx.hub.clock)
        self.detector_interval = detector_interval
        self._held: dict[str, list[Event]] = {}  # engine -> triggers waiting for its commit
        self._down: dict[str, Alert] = {}
        ctx.hub.event_listeners.append(self.on_event)

    @property
    def public_url(self) -> str:
        s = self.ctx.settings
        if s.alerting.public_url or s.public_url:
            return (s.alerting.public_url or s.public_url or "").rstrip("/")
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host
        port = self.ctx.service_port() if hasattr(self.ctx, "service_port") else s.port
        return f"http://{host}:{port}"

    def stats(self) -> dict[str, int]:
        st = self.client.stats()
        return {"sent": st.sent, "failed": st.failed, "dropped": st.dropped}

    def _alert(self, ev: Event, snapshot_id: int | None = None) -> Alert | None:
        return alert_for_event(ev, host=self.host, public_url=self.public_url, snapshot_id=snapshot_id,
                               runbook_base=self.runbook_base, hold=self.hold)  # fmt: skip

    def _fire(self, ev: Event, snapshot_id: int | None = None) -> None:
        alert = self._alert(ev, snapshot_id)
        if alert is None:
            return
        self.client.fire(alert)
        if ev.kind is EventKind.ENGINE_DOWN and ev.engine:
            self._down[ev.engine] = alert

    # Hub listener: runs on the loop, after the hub has scheduled any snapshot.
    def on_event(self, ev: Event, is_new: bool) -> None:
        if not is_new or (ev.kind is EventKind.ANOMALY and ev.data.get("alerted")):
            return
        if not is_trigger(ev):
            self._fire(ev)
            return
        targets = self.ctx.snapshots.snapshots_for(ev)
        if not targets:
            self._fire(ev)  # no snapshot for it (e.g. an engine never seen up)
            return
        for name, snapshot_id in targets.items():
            if snapshot_id is not None:
                self._fire(ev, snapshot_id)
            else:
                self._held.setdefault(name, []).append(ev)

    def snapshot_committed(self, doc: SnapshotDoc, trigger: Event) -> None:
        for ev in self._held.pop(doc.engine, []):
            self._fire(ev, doc.id)

    async def run(self) -> None:
        sender = asyncio.create_task(self.client.run(), name="alertmanager-client")
        try:
            while True:
                await asyncio.sleep(self.detector_interval)
                try:
                    self.tick()
                except Exception:
                    log.exception("detector evaluation failed")
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    def tick(self) -> None:
        hub = self.ctx.hub
        steps = {name: st.ring.steps()[-2048:] for name, st in hub.engines.items()}
        scrapes = {name: list(st.scrapes) for name, st in hub.engines.items()}
        samples = {gpu: ring.since(0.0) for gpu, ring in hub.gpus.items()}
        for tr in self.runner.evaluate(steps, samples, scrapes):
            fire, resolve = alerts_for_transition(tr, host=self.host, public_url=self.public_url,
                                                  runbook_base=self.runbook_base)  # fmt: skip
            if resolve is not None:
                self.client.resolve(resolve)
            if fire is not None:
                self.client.fire(fire)
            cur = tr.current
            hub.emit(Event(
                kind=EventKind.ANOMALY, ts=cur.ts, source="detector",
                message=f"{cur.name} {cur.state.value}: {cur.reason}",
                severity=Severity(cur.state.value) if cur.state.value != "ok" else Severity.INFO,
                engine=cur.labels.get("engine"), gpu=cur.labels.get("gpu"),
                data={"detector": cur.name, "state": cur.state.value, "labels": cur.labels,
                      "suggested_action": cur.suggested_action, "value": cur.value, "alerted": True},
            ))  # fmt: skip
        for name, alert in list(self._down.items()):
            st = hub.engines.get(name)
            if st is not None and st.up:
                self.client.resolve(alert.key)
                del self._down[name]

    async def aclose(self) -> None:
        await self.client.aclose()
