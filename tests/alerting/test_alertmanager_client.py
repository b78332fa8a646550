"""AlertmanagerClient against fake Alertmanagers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime

import httpx
import pytest

from collector.alerting.alertmanager import AlertmanagerClient
from collector.alerting.alerts import Alert
from collector.model import Severity

A = "http://am-a:9093"
B = "http://am-b:9093"


def parse_ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class FakeAlertmanagers:
    """Records every POST per host; a host in ``down`` refuses connections."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, float, list[dict]]] = []
        self.down: set[str] = set()
        self.status = 200
        self.delay: dict[str, float] = {}

    async def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.delay:
            await asyncio.sleep(self.delay[host])
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        assert request.url.path == "/api/v2/alerts"
        self.posts.append((host, time.time(), json.loads(request.content)))
        return httpx.Response(self.status)

    def alerts_to(self, host: str) -> list[dict]:
        return [a for h, _, body in self.posts if h == host for a in body]


def alert(name: str = "VllmEngineCrashed", engine: str = "decode-0", **kw) -> Alert:
    return Alert(
        name=name,
        severity=Severity.CRITICAL,
        labels={"engine": engine, "host": "n1"},
        annotations={"summary": "s"},
        starts_at=kw.pop("starts_at", time.time()),
        **kw,
    )


def run_with(fake: FakeAlertmanagers, urls: list[str], scenario: Callable, **kw) -> AlertmanagerClient:
    async def main() -> AlertmanagerClient:
        client = AlertmanagerClient(urls, transport=httpx.MockTransport(fake.handler), **kw)
        runner = asyncio.create_task(client.run())
        try:
            await scenario(client)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await client.aclose(flush_timeout=0.2)
        return client

    return asyncio.run(main())


async def wait_for(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def test_a_fired_alert_is_posted_within_milliseconds_with_endsAt_ahead() -> None:
    fake = FakeAlertmanagers()
    fired_at: list[float] = []

    async def scenario(client: AlertmanagerClient) -> None:
        await asyncio.sleep(0.05)
        fired_at.append(time.time())
        client.fire(alert())
        await wait_for(lambda: bool(fake.posts))

    run_with(fake, [A], scenario, resend_interval=60)
    host, posted_at, body = fake.posts[0]
    assert posted_at - fired_at[0] < 0.05
    (sent,) = body
    assert sent["labels"] == {"alertname": "VllmEngineCrashed", "severity": "critical", "engine": "decode-0", "host": "n1"}
    ends = parse_ts(sent["endsAt"])
    assert 4 * 60 - 2 < ends - posted_at <= 4 * 60 + 1


def test_alerts_queued_together_go_in_batches_of_batch_max() -> None:
    fake = FakeAlertmanagers()

    async def scenario(client: AlertmanagerClient) -> None:
        for i in range(10):  # all queued before the sender runs
            client.fire(alert(engine=f"e{i}"))
        await wait_for(lambda: len(fake.alerts_to("am-a")) >= 10)

    client = run_with(fake, [A], scenario, batch_max=4)
    sizes = [len(body) for _, _, body in fake.posts]
    assert sizes == [4, 4, 2]
    assert client.stats().sent == 10


def test_firing_alerts_are_resent_every_interval_and_the_same_label_set_is_one_alert() -> None:
    fake = FakeAlertmanagers()
    first = time.time() - 100

    async def scenario(client: AlertmanagerClient) -> None:
        client.fire(alert(starts_at=first))
        client.fire(alert(starts_at=first + 50))  # same labels: the earliest startsAt stays
        await wait_for(lambda: len(fake.alerts_to("am-a")) >= 3, timeout=2)

    run_with(fake, [A], scenario, resend_interval=0.1)
    sent = fake.alerts_to("am-a")
    assert all(parse_ts(a["startsAt"]) == pytest.approx(first, abs=0.001) for a in sent)
    times = [t for _, t, _ in fake.posts]
    assert all(b - a >= 0.08 for a, b in zip(times, times[1:], strict=False))
    for _, t, body in fake.posts:
        assert parse_ts(body[0]["endsAt"]) - t == pytest.approx(0.4, abs=0.05)


def test_resolve_sends_endsAt_in_the_past_and_resends_only_for_a_while() -> None:
    fake = FakeAlertmanagers()

    async def scenario(client: AlertmanagerClient) -> None:
        a = alert()
        client.fire(a)
        await wait_for(lambda: len(fake.posts) == 1)
        resolved_at = time.time()
        assert client.resolve(a.key, at=resolved_at)
        assert not client.resolve(a.key)  # no longer firing
        await asyncio.sleep(0.6)
        assert client.stats().resolved == 0  # forgotten after resolved_resend_for
        count = len(fake.posts)
        await asyncio.sleep(0.3)
        assert len(fake.posts) == count  # nothing resent once forgotten
        resolved = [b[0] for _, _, b in fake.posts[1:]]
        assert len(resolved) >= 2  # sent once, then resent
        assert all(parse_ts(r["endsAt"]) == pytest.approx(resolved_at, abs=0.001) for r in resolved)

    run_with(fake, [A], scenario, resend_interval=0.1, resolved_resend_for=0.35)


def test_an_event_alert_expires_into_resolved() -> None:
    fake = FakeAlertmanagers()

    async def scenario(client: AlertmanagerClient) -> None:
        client.fire(alert(expires_at=time.time() + 0.2))
        await wait_for(lambda: any(parse_ts(b[0]["endsAt"]) < t for _, t, b in fake.posts), timeout=2)
        assert client.stats().active == 0

    run_with(fake, [A], scenario, resend_interval=60)


def test_backoff_while_down_then_delivery_when_back() -> None:
    fake = FakeAlertmanagers()
    fake.down.add("am-a")

    async def scenario(client: AlertmanagerClient) -> None:
        client.fire(alert())
        await asyncio.sleep(0.5)
        stats = client.stats().targets[0]
        assert not stats.up and "ConnectError" in stats.last_error
        # 0.02, 0.04, 0.08, 0.16, 0.32: about 5 attempts in 0.5 s, not hundreds
        assert 3 <= stats.failed <= 8
        fake.down.clear()
        await wait_for(lambda: bool(fake.posts), timeout=1.0)

    client = run_with(fake, [A], scenario, backoff_min=0.02, backoff_max=0.5)
    assert client.stats().targets[0].up
    assert client.stats().sent == 1


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    fake = FakeAlertmanagers()
    fake.down.add("am-a")

    async def scenario(client: AlertmanagerClient) -> None:
        for i in range(8):
            client.fire(alert(engine=f"e{i}", starts_at=1000.0 + i))
        assert client.stats().dropped == 5
        assert client.stats().targets[0].queued == 3
        fake.down.clear()
        await wait_for(lambda: len(fake.alerts_to("am-a")) >= 3, timeout=1.0)

    run_with(fake, [A], scenario, queue_max=3, backoff_min=0.01)
    engines = [a["labels"]["engine"] for a in fake.alerts_to("am-a")]
    assert engines[:3] == ["e5", "e6", "e7"]


def test_every_alertmanager_of_an_ha_pair_gets_it_and_a_dead_one_does_not_delay_the_other() -> None:
    fake = FakeAlertmanagers()
    fake.down.add("am-b")
    fake.delay["am-b"] = 0.3  # a slow failure, like a connect timeout

    async def scenario(client: AlertmanagerClient) -> None:
        fired = time.time()
        client.fire(alert())
        await wait_for(lambda: bool(fake.alerts_to("am-a")), timeout=1.0)
        assert time.time() - fired < 0.1
        await wait_for(lambda: client.stats().targets[1].failed >= 1, timeout=1.0)
        fake.down.clear()
        fake.delay.clear()
        await wait_for(lambda: bool(fake.alerts_to("am-b")), timeout=2.0)

    client = run_with(fake, [A, B], scenario, backoff_min=0.05)
    a_stats, b_stats = client.stats().targets
    assert a_stats.failed == 0 and a_stats.sent == 1
    assert b_stats.failed >= 1 and b_stats.sent == 1


def test_a_rejected_batch_is_counted_and_not_retried() -> None:
    fake = FakeAlertmanagers()
    fake.status = 400

    async def scenario(client: AlertmanagerClient) -> None:
        client.fire(alert())
        await wait_for(lambda: client.stats().failed == 1)
        await asyncio.sleep(0.2)

    client = run_with(fake, [A], scenario, backoff_min=0.01)
    assert len(fake.posts) == 1
    assert client.stats().targets[0].queued == 0


def test_aclose_flushes_what_is_queued() -> None:
    fake = FakeAlertmanagers()

    async def main() -> None:
        client = AlertmanagerClient([A], transport=httpx.MockTransport(fake.handler))
        client.fire(alert())  # run() never started
        await client.aclose()

    asyncio.run(main())
    assert len(fake.alerts_to("am-a")) == 1
