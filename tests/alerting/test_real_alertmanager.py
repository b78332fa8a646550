"""The client against a real Alertmanager on loopback, watched through a webhook receiver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from collector.alerting.alertmanager import AlertmanagerClient
from collector.alerting.alerts import alert_for_event
from collector.model import Event, EventKind, Severity
from tests.support.alertmanager import LocalAlertmanager, WebhookReceiver, find_binary, free_port

pytestmark = [
    pytest.mark.alertmanager,
    pytest.mark.skipif(find_binary() is None, reason="no alertmanager binary"),
]

XID_LINE = "NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3, channel 0x0000000a"


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def alertmanager(webhook: WebhookReceiver) -> Iterator[LocalAlertmanager]:
    am = LocalAlertmanager(webhook.url)
    yield am.start()
    am.close()


def xid_event(gpu: str = "0000:00:06.0") -> Event:
    return Event(kind=EventKind.XID, ts=time.time(), source="kmsg", message=XID_LINE, severity=Severity.CRITICAL, gpu=gpu, xid=43, pid=415)


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    started = time.monotonic()
    while True:
        if await asyncio.to_thread(predicate):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def run_client(urls: list[str], scenario, **kw) -> None:
    async def main() -> None:
        client = AlertmanagerClient(urls, backoff_min=0.05, backoff_max=0.3, **kw)
        task = asyncio.create_task(client.run())
        try:
            await scenario(client)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose(flush_timeout=0.5)

    asyncio.run(main())


def test_a_fault_becomes_an_alert_in_alertmanager(alertmanager: LocalAlertmanager, webhook: WebhookReceiver) -> None:
    alert = alert_for_event(
        xid_event(), host="node-1", public_url="http://127.0.0.1:8080", snapshot_id=7, runbook_base="https://docs.example/alerting"
    )
    assert alert is not None

    async def scenario(client: AlertmanagerClient) -> None:
        client.fire(alert)
        await eventually(lambda: bool(alertmanager.alerts("GpuXidError")))
        await eventually(lambda: bool(webhook.alerts("firing")))

    run_client([alertmanager.url], scenario)
    (seen,) = alertmanager.alerts("GpuXidError")
    assert seen["labels"] == {"alertname": "GpuXidError", "severity": "critical", "Hostname": "node-1", "pci_bus_id": "00000000:00:06.0", "xid": "43"}
    assert seen["generatorURL"] == "http://127.0.0.1:8080/snapshots/7"
    assert seen["annotations"]["runbook_url"] == "https://docs.example/alerting#gpuxiderror"
    assert seen["status"]["state"] == "active"


def test_alertmanager_down_then_up_still_gets_the_alert(webhook: WebhookReceiver) -> None:
    am = LocalAlertmanager(webhook.url, port=free_port())
    alert = alert_for_event(xid_event(), host="node-1", public_url="")
    assert alert is not None
    try:

        async def scenario(client: AlertmanagerClient) -> None:
            client.fire(alert)
            await eventually(lambda: client.stats().failed >= 2)  # it tried, and is backing off
            assert client.stats().targets[0].queued == 1
            await asyncio.to_thread(am.start)
            await eventually(lambda: bool(am.alerts("GpuXidError")))

        run_client([am.url], scenario)
    finally:
        am.close()


def test_a_cleared_condition_resolves(alertmanager: LocalAlertmanager, webhook: WebhookReceiver) -> None:
    down = Event(kind=EventKind.ENGINE_DOWN, ts=time.time(), source="scrape", message="connection refused", engine="decode-0")
    alert = alert_for_event(down, host="node-1", public_url="")
    assert alert is not None

    async def scenario(client: AlertmanagerClient) -> None:
        client.fire(alert)
        await eventually(lambda: bool(webhook.alerts("firing")))
        client.resolve(alert.key)  # the engine answers again
        await eventually(lambda: bool(webhook.alerts("resolved")))
        await eventually(lambda: not alertmanager.alerts("VllmEngineDown"))

    run_client([alertmanager.url], scenario)
    (resolved,) = webhook.alerts("resolved")
    assert resolved["labels"]["alertname"] == "VllmEngineDown"
    assert resolved["labels"]["engine"] == "decode-0"


def test_an_ha_pair_both_get_it_when_one_is_down(webhook: WebhookReceiver) -> None:
    up = LocalAlertmanager(webhook.url).start()
    dead_url = f"http://127.0.0.1:{free_port()}"
    alert = alert_for_event(xid_event(), host="node-1", public_url="")
    assert alert is not None
    try:

        async def scenario(client: AlertmanagerClient) -> None:
            client.fire(alert)
            took = await eventually(lambda: bool(up.alerts("GpuXidError")))
            assert took < 1.0

        run_client([dead_url, up.url], scenario)
    finally:
        up.close()
