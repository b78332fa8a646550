"""A wedge through the sidecar's own path, as the service wires it: the watch's event opens the
wedge's snapshot, VllmEngineWedged pages once it is committed (critical, its link), the engine
steps again, the page resolves and the snapshot's summary says how long it was stuck."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from collector.alerting.alerts import alert_for_event
from collector.alerting.router import Alerter
from collector.detectors.config import WedgeThresholds
from collector.detectors.wedge_watch import WedgeWatch
from collector.model import HALF_STATS, Event, EventKind, Severity, StepRecord
from collector.settings import EngineConfig, Settings
from collector.snapshot.ledger import SnapshotLedger
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from tests.alerting.test_router import RecordingClient
from tests.wiring import with_committer


def test_a_wedge_pages_with_its_snapshot_and_resolves_when_the_engine_moves_again(migrated_url: str, tmp_path: Path) -> None:
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")], public_url="http://fr.example")
    repo = Repository(make_engine(migrated_url), host="node-a")
    ledger = SnapshotLedger()
    client = RecordingClient()
    alerter = Alerter(settings, host="node-a", snapshots_for=ledger.snapshots_for, engine_up=lambda n: True, port=lambda: 8787, client=client)  # type: ignore[arg-type]
    committed: list[int] = []

    def on_commit(doc: Any, trigger: Event) -> None:
        committed.append(doc.id)
        alerter.snapshot_committed(doc, trigger)

    offset = [0.0]  # the watch's clock runs ahead of the wall clock by what the test skips
    hub, committer = with_committer(
        settings,
        repo,
        clock=lambda: time.time() + offset[0],
        ledger=ledger,
        spool_dir=tmp_path / "spool",
        settle_s=0.1,
        window_s=30,
        on_committed=[on_commit],
        then=[alerter.on_event],
    )
    watch = WedgeWatch(hub.view, hub.emit, WedgeThresholds())

    def steps(first: int, n: int) -> None:
        for i in range(n):
            hub.emit(StepRecord(engine="decode-0", ts=time.time() + offset[0], step=first + i, running=8, waiting=0, halves=HALF_STATS))
        watch.tick()

    async def scenario() -> None:
        task = asyncio.create_task(committer.run())
        steps(1, 30)
        for _ in range(11):  # 11 s without a step, a tick each second
            offset[0] += 1.0
            watch.tick()
        for _ in range(100):
            if client.fired:
                break
            await asyncio.sleep(0.02)
        offset[0] += 4.0
        steps(31, 5)  # it moves again
        for _ in range(50):  # its end is linked to the snapshot once the snapshot is amended
            if committed and "resumed" in (await asyncio.to_thread(repo.get_snapshot, committed[0])).summary:
                break
            await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(scenario())
    assert len(committed) == 1
    sid = committed[0]
    [(_, alert)] = client.fired
    assert alert.name == "VllmEngineWedged" and alert.severity is Severity.CRITICAL
    assert alert.label_set() == {"alertname": "VllmEngineWedged", "severity": "critical", "Hostname": "node-a", "engine": "decode-0"}
    assert alert.generator_url == f"http://fr.example/snapshots/{sid}" and alert.annotations["snapshot_url"] == alert.generator_url
    assert "8 requests held" in alert.annotations["description"] and alert.expires_at is None  # resolved by its end, not a hold
    assert client.resolved == [alert.key]
    doc = repo.get_snapshot(sid)
    assert doc.trigger["kind"] == "engine_wedged" and doc.engine == "decode-0"
    assert [s["step"] for s in doc.steps][:30] == list(range(1, 31))  # the steps before it (its amendment may hold later ones)
    resumed = doc.summary["resumed"]
    assert 14.0 <= resumed["stuck_s"] <= 16.5  # 11 s to the wedge, 4 s more, within a tick
    kinds = [e["kind"] for e in repo.list_events(engine="decode-0")]
    assert "engine_wedged" in kinds and "engine_resumed" in kinds


def test_the_wedge_alert_of_an_event_alone() -> None:
    ev = Event(kind=EventKind.ENGINE_WEDGED, ts=100.0, source="detector", message="decode-0 wedged", severity=Severity.CRITICAL, engine="decode-0")
    alert = alert_for_event(ev, host="node-a", public_url="http://fr.example", snapshot_id=7)
    assert alert is not None and alert.name == "VllmEngineWedged" and alert.generator_url == "http://fr.example/snapshots/7"
    resumed = Event(kind=EventKind.ENGINE_RESUMED, ts=130.0, source="detector", message="moved", severity=Severity.INFO, engine="decode-0")
    assert alert_for_event(resumed, host="node-a", public_url="") is None  # its end resolves, it does not page
