"""The alerter inside the sidecar: an alert about a snapshot leaves only after that snapshot is
committed, and a fault written to a followed kernel log reaches a real Alertmanager with a link
that opens."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from collector.alerting.alerts import Alert
from collector.alerting.router import Alerter
from collector.ingest.hub import Hub
from collector.model import Event, EventKind, Severity, StepRecord
from collector.service import Service
from collector.settings import EngineConfig, Settings
from collector.snapshot.committer import SnapshotCommitter
from collector.snapshot.ledger import SnapshotLedger
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from tests.support.alertmanager import LocalAlertmanager, WebhookReceiver, find_binary
from tests.wiring import with_committer

XID_LINE = "NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3, channel 0x0000000a"


class RecordingClient:
    def __init__(self) -> None:
        self.fired: list[tuple[float, Alert]] = []
        self.resolved: list[object] = []

    def fire(self, alert: Alert) -> None:
        self.fired.append((time.time(), alert))

    def resolve(self, key: object) -> bool:
        self.resolved.append(key)
        return True


def _wired(
    url: str, tmp_path: Path, *, retaken_pages: bool = False, **kw: Any
) -> tuple[Hub, SnapshotCommitter, Alerter, RecordingClient, list[tuple[float, int]]]:
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")], public_url="http://fr.example")
    repo = Repository(make_engine(url), host="node-a")
    ledger = SnapshotLedger()
    client = RecordingClient()
    alerter = Alerter(settings, host="node-a", snapshots_for=ledger.snapshots_for, engine_up=lambda n: None, port=lambda: 8787, client=client, **kw)  # type: ignore[arg-type]
    committed: list[tuple[float, int]] = []

    def on_commit(doc: Any, trigger: Event) -> None:
        committed.append((time.time(), doc.id))
        alerter.snapshot_committed(doc, trigger)

    hub, committer = with_committer(
        settings,
        repo,
        ledger=ledger,
        spool_dir=tmp_path / "spool",
        settle_s=0.1,
        window_s=30,
        on_committed=[on_commit],
        on_retaken=[lambda e: alerter.on_event(e, True)] if retaken_pages else [],  # as the service wires it
        then=[alerter.on_event],
    )
    return hub, committer, alerter, client, committed


def test_the_crash_alert_waits_for_the_commit_and_links_the_snapshot(migrated_url: str, tmp_path: Path) -> None:
    hub, committer, alerter, client, committed = _wired(migrated_url, tmp_path)

    async def scenario() -> None:
        task = asyncio.create_task(committer.run())
        for i in range(20):
            hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=2))
        hub.emit(
            Event(
                kind=EventKind.CUDA_ERROR,
                ts=time.time(),
                source="log",
                engine="decode-0",
                message="CUDA error: unspecified launch failure",
                severity=Severity.CRITICAL,
            )
        )
        assert client.fired == []  # held: its snapshot is not committed yet
        for _ in range(100):
            if client.fired:
                break
            await asyncio.sleep(0.02)
        # a late witness of the same fault pages at once, with the same link
        hub.emit(
            Event(
                kind=EventKind.ENGINE_FATAL,
                ts=time.time(),
                source="log",
                engine="decode-0",
                message="EngineCore encountered a fatal error.",
                severity=Severity.CRITICAL,
            )
        )
        task.cancel()

    asyncio.run(scenario())
    assert len(committed) == 1 and len(client.fired) == 2
    (commit_ts, sid), (fire_ts, alert) = committed[0], client.fired[0]
    assert fire_ts >= commit_ts
    assert alert.name == "VllmEngineCrashed" and alert.generator_url == f"http://fr.example/snapshots/{sid}"
    assert client.fired[1][1].generator_url == alert.generator_url


def test_a_database_that_is_down_does_not_hold_the_page(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no-tables.db'}"  # never migrated: every commit fails
    hub, committer, alerter, client, committed = _wired(url, tmp_path, hold_max_s=0.2)

    async def scenario() -> None:
        task = asyncio.create_task(committer.run())
        hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=1, running=2))
        hub.emit(Event(kind=EventKind.CUDA_ERROR, ts=time.time(), source="log", engine="decode-0", message="CUDA error", severity=Severity.CRITICAL))
        for _ in range(20):
            alerter.tick()
            if client.fired:
                break
            await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(scenario())
    assert not committed and len(client.fired) == 1  # paged without the link, within hold_max_s


def test_a_critical_stall_takes_its_snapshot_with_no_alertmanager(migrated_url: str, tmp_path: Path) -> None:
    """The detector task runs without any Alertmanager: a stall it judges critical is an event
    that takes its snapshot (through the committer alone, no router)."""
    from collector.detectors.task import DetectorTask

    t0 = 1_796_000_000.0
    now = [t0 + 40]
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")])
    repo = Repository(make_engine(migrated_url), host="node-a")
    hub, committer = with_committer(settings, repo, clock=lambda: now[0], spool_dir=tmp_path / "s", settle_s=0.1, window_s=30)
    task = DetectorTask(hub.view, hub.emit, settings.detectors)
    for i in range(400):  # 40 s of steps with requests waiting and no token computed
        hub.emit(
            StepRecord(
                engine="decode-0",
                ts=t0 + i * 0.1,
                step=i,
                running=0,
                waiting=3,
                kv_cache_usage=0.5,
                preemptions=0,
                prompt_tokens=0,
                generation_tokens=0,
                halves=1,
            )
        )
    assert committer.backlog == 0
    for _ in range(settings.detectors.enter_after + 1):
        task.tick()
        now[0] += 1.0
    stall = [s for s in task.states() if s.name == "engine_stall"]
    assert stall and stall[0].state.value == "critical", task.states()
    assert committer.backlog == 1 and committer.ledger.current("decode-0").trigger.kind  # type: ignore[union-attr] is EventKind.ANOMALY


@pytest.fixture
def alertmanager() -> Iterator[LocalAlertmanager]:
    if find_binary() is None:
        pytest.fail("no alertmanager binary (scripts/install-test-deps.sh installs it)")
    hook = WebhookReceiver().start()
    am = LocalAlertmanager(hook.url).start()
    yield am
    am.close()
    hook.stop()


@pytest.mark.alertmanager
def test_an_xid_line_becomes_an_alert_whose_link_opens(alertmanager: LocalAlertmanager, tmp_path: Path) -> None:
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    settings = Settings(
        engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")],
        database=f"sqlite:///{tmp_path / 'f.db'}",
        alertmanager=[alertmanager.url],
        kmsg=str(kmsg),
        nvml="off",
        port=0,
        recorder_dir=tmp_path / "rec",
    )
    svc = Service(settings)

    async def scenario() -> tuple[dict[str, Any], int]:
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        assert svc.ctx is not None
        for i in range(10):  # the engine was alive: it has steps to freeze
            svc.ctx.hub.emit(StepRecord(engine="decode-0", ts=time.time(), step=i, running=1, halves=1))
        await asyncio.sleep(0.3)
        with open(kmsg, "a") as f:
            f.write(f"4,900,{int(time.monotonic() * 1e6)},-;{XID_LINE}\n")
        found: dict[str, Any] | None = None
        deadline = time.monotonic() + 10
        while found is None and time.monotonic() < deadline:
            found = next((a for a in await asyncio.to_thread(alertmanager.alerts, "GpuXidError")), None)
            await asyncio.sleep(0.05)
        assert found is not None, "no GpuXidError alert in Alertmanager"
        async with httpx.AsyncClient() as c:
            link = found["generatorURL"]
            sid = int(link.rsplit("/", 1)[1])
            doc = (await c.get(f"http://127.0.0.1:{svc.port}/api/v1/snapshots/{sid}")).json()
        svc.request_stop()
        await task
        return found, doc["id"]

    alert, sid = asyncio.run(scenario())
    assert alert["labels"]["xid"] == "43" and alert["labels"]["pci_bus_id"] == "00000000:00:06.0"
    assert alert["labels"]["severity"] == "warning"  # the catalog: Xid 43 is an application fault
    assert alert["generatorURL"].endswith(f"/snapshots/{sid}")


def test_a_trigger_retaken_at_start_pages_with_its_retaken_snapshot(migrated_url: str, tmp_path: Path) -> None:
    """A sidecar killed before its snapshot was committed never sent the page (it waits for the
    commit); the next start retakes the trigger from its intent, and the page goes with the link."""
    from collector.snapshot import intent

    ev = Event(kind=EventKind.XID, ts=time.time() - 5, source="kmsg", message=XID_LINE, xid=43, severity=Severity.CRITICAL, uid="ab" * 16)
    intent.write(tmp_path / "spool", "decode-0", ev, ev.ts)  # what the killed sidecar left
    hub, committer, alerter, client, committed = _wired(migrated_url, tmp_path, retaken_pages=True)

    async def scenario() -> None:
        task = asyncio.create_task(committer.run())
        for _ in range(100):
            if any(a.name == "GpuXidError" for _, a in client.fired):
                break
            await asyncio.sleep(0.02)
        task.cancel()

    asyncio.run(scenario())
    # the GPU's page and the engine's crash page (an Xid's snapshot is a crash), each once
    assert len(committed) == 1 and sorted(a.name for _, a in client.fired) == ["GpuXidError", "VllmEngineCrashed"]
    for _, alert in client.fired:
        assert alert.generator_url == f"http://fr.example/snapshots/{committed[0][1]}" and alert.starts_at == ev.ts


def test_an_alert_held_for_its_snapshot_pages_the_event_a_later_witness_merged_into() -> None:
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")], public_url="http://fr.example")
    links: dict[str, int | None] = {"decode-0": None}
    client = RecordingClient()
    alerter = Alerter(settings, host="node-a", snapshots_for=lambda ev: dict(links), engine_up=lambda n: None, port=lambda: 8787, client=client)  # type: ignore[arg-type]
    first = Event(kind=EventKind.XID, ts=1000.0, source="nvml", message="Xid 43", xid=43, gpu="0000:00:06.0", severity=Severity.CRITICAL, uid="u1")
    alerter.on_event(first, True)
    assert client.fired == []  # held until its snapshot commits
    merged = dataclasses.replace(first, message=XID_LINE, pid=415, sources=["nvml", "kmsg"])
    alerter.on_event(merged, False)
    links["decode-0"] = 7
    alerter.snapshot_committed(SimpleNamespace(engine="decode-0", id=7), first)  # type: ignore[arg-type]
    [alert] = [a for _, a in client.fired if a.name == "GpuXidError"]
    assert any(XID_LINE in text for text in alert.annotations.values())
    assert first.message == "Xid 43" and first.sources == ["nvml"]  # the first report is not changed


@pytest.mark.parametrize("kind", [EventKind.XID, EventKind.GPU_LOST, EventKind.RECORDER_SILENT, EventKind.NCCL_ERROR])
def test_every_crash_snapshot_pages_the_engines_crash_whatever_opened_it(kind: EventKind) -> None:
    """The incident's own shape: an Xid opens the decode engine's snapshot. That snapshot is a
    crash (the engine is dead after it), so the engine's VllmEngineCrashed pages with the
    snapshot's link, with the label set the rule over flightrec_snapshots_total sends; the
    GPU's own alert pages as well (one page per GPU, one per dead engine)."""
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")], public_url="http://fr.example")
    client = RecordingClient()
    alerter = Alerter(settings, host="node-a", snapshots_for=lambda ev: {"decode-0": 7}, engine_up=lambda n: None, port=lambda: 8787, client=client)  # type: ignore[arg-type]
    trigger = Event(
        kind=kind,
        ts=1000.0,
        source="kmsg",
        message=f"{kind.value} witnessed",
        xid=43 if kind is EventKind.XID else None,
        severity=Severity.CRITICAL,
        uid="u1",
    )
    alerter.snapshot_committed(SimpleNamespace(engine="decode-0", id=7), trigger)  # type: ignore[arg-type]
    crashes = [a for _, a in client.fired if a.name == "VllmEngineCrashed"]
    assert len(crashes) == 1
    assert crashes[0].label_set() == {"alertname": "VllmEngineCrashed", "severity": "critical", "Hostname": "node-a", "engine": "decode-0"}
    assert crashes[0].generator_url == "http://fr.example/snapshots/7" and crashes[0].starts_at == 1000.0


@pytest.mark.parametrize("kind", [EventKind.MANUAL, EventKind.ENGINE_DOWN, EventKind.ANOMALY, EventKind.ENGINE_WEDGED])
def test_a_snapshot_that_is_no_crash_pages_no_crash(kind: EventKind) -> None:
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://127.0.0.1:9")], public_url="http://fr.example")
    client = RecordingClient()
    alerter = Alerter(settings, host="node-a", snapshots_for=lambda ev: {"decode-0": 7}, engine_up=lambda n: None, port=lambda: 8787, client=client)  # type: ignore[arg-type]
    trigger = Event(kind=kind, ts=1000.0, source="api", engine="decode-0", message="x", severity=Severity.CRITICAL, uid="u1")
    alerter.snapshot_committed(SimpleNamespace(engine="decode-0", id=7), trigger)  # type: ignore[arg-type]
    assert [a for _, a in client.fired if a.name == "VllmEngineCrashed"] == []
