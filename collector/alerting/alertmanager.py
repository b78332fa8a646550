"""A client for Alertmanager's v2 API that pages within milliseconds of ``fire()``.

Behaviour, as Prometheus' notifier does it, without its evaluation-interval delay:

- ``fire(alert)`` and ``resolve(key)`` are synchronous and never block; they queue the alert
  for every configured Alertmanager (HA pairs get the same alerts) and wake the senders, which
  POST a batch at once.
- Firing alerts are resent every ``resend_interval`` with ``endsAt`` = now + 4 intervals, so
  Alertmanager resolves them by itself if this process dies. Resolved alerts are sent with
  ``endsAt`` in the past, and resent for ``resolved_resend_for``.
- Each Alertmanager has its own queue and sender: one that is down backs off exponentially
  (``backoff_min`` doubling to ``backoff_max``) without delaying the others.
- A queue holds at most ``queue_max`` alerts; when full the oldest is dropped and counted.
  Dropping is safe for firing alerts: the next resend carries them again.

Nothing here raises to the caller: delivery failures are data, counted in ``stats()`` and
logged. A 4xx answer is not retried (the same batch would be rejected again); connection
errors, 5xx and 429 are.

``fire``/``resolve`` must be called on the event loop that runs ``run()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from collector.alerting.alerts import Alert, AlertKey

log = logging.getLogger(__name__)

RESEND_INTERVAL = 60.0
RESOLVED_RESEND_FOR = 900.0
BATCH_MAX = 64
QUEUE_MAX = 10_000
BACKOFF_MIN = 0.1
BACKOFF_MAX = 10.0
TIMEOUT = 5.0


@dataclass(slots=True)
class TargetStats:
    url: str
    sent: int  # alerts accepted (2xx), counted once per alert per POST
    failed: int  # alerts in POSTs that failed (connection error or non-2xx)
    dropped: int  # alerts dropped from a full queue
    queued: int
    up: bool  # last POST succeeded
    last_error: str


@dataclass(slots=True)
class ClientStats:
    active: int
    resolved: int
    targets: list[TargetStats]

    @property
    def sent(self) -> int:
        return sum(t.sent for t in self.targets)

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.targets)

    @property
    def dropped(self) -> int:
        return sum(t.dropped for t in self.targets)


class _Target:
    def __init__(self, url: str, queue_max: int) -> None:
        self.url = url.rstrip("/")
        self.endpoint = self.url + "/api/v2/alerts"
        self.queue: OrderedDict[AlertKey, None] = OrderedDict()
        self.queue_max = queue_max
        self.wake = asyncio.Event()
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.up = True
        self.last_error = ""

    def push(self, key: AlertKey) -> None:
        if key in self.queue:
            return  # the newest version is read at send time
        self.queue[key] = None
        while len(self.queue) > self.queue_max:
            self.queue.popitem(last=False)
            self.dropped += 1
        self.wake.set()


class AlertmanagerClient:
    def __init__(
        self,
        urls: Iterable[str],
        *,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        resend_interval: float = RESEND_INTERVAL,
        resolved_resend_for: float = RESOLVED_RESEND_FOR,
        batch_max: int = BATCH_MAX,
        queue_max: int = QUEUE_MAX,
        backoff_min: float = BACKOFF_MIN,
        backoff_max: float = BACKOFF_MAX,
        timeout: float = TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._targets = [_Target(u, queue_max) for u in urls]
        self._own_client = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport, timeout=timeout)
        self.resend_interval = resend_interval
        self.resolved_resend_for = resolved_resend_for
        self.batch_max = batch_max
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self._clock = clock
        self._active: dict[AlertKey, Alert] = {}
        self._resolved: dict[AlertKey, Alert] = {}
        self._next_resend: dict[AlertKey, float] = {}
        self._schedule_changed = asyncio.Event()

    # -- the non-blocking side ------------------------------------------------------------

    def fire(self, alert: Alert) -> None:
        """Page now (or refresh an alert already firing: the earliest startsAt is kept)."""
        key = alert.key
        known = self._active.get(key)
        if known is not None and known.starts_at and known.starts_at < alert.starts_at:
            alert.starts_at = known.starts_at
        if not alert.starts_at:
            alert.starts_at = self._clock()
        alert.ends_at = None
        self._resolved.pop(key, None)
        self._active[key] = alert
        self._queue(key)

    def resolve(self, key: AlertKey, at: float | None = None) -> bool:
        """Mark a firing alert resolved (endsAt = at, default now). False if it was not firing."""
        alert = self._active.pop(key, None)
        if alert is None:
            return False
        alert.ends_at = self._clock() if at is None else at
        self._resolved[key] = alert
        self._queue(key)
        return True

    def active(self) -> list[Alert]:
        return list(self._active.values())

    def stats(self) -> ClientStats:
        return ClientStats(
            active=len(self._active),
            resolved=len(self._resolved),
            targets=[TargetStats(t.url, t.sent, t.failed, t.dropped, len(t.queue), t.up, t.last_error) for t in self._targets],
        )

    def _queue(self, key: AlertKey) -> None:
        self._next_resend[key] = self._clock() + self.resend_interval
        for target in self._targets:
            target.push(key)
        self._schedule_changed.set()

    # -- the async side ---------------------------------------------------------------------

    async def run(self) -> None:
        """Send until cancelled: one sender per Alertmanager, and the resend schedule."""
        tasks = [asyncio.create_task(self._sender(t), name=f"alertmanager {t.url}") for t in self._targets]
        tasks.append(asyncio.create_task(self._scheduler(), name="alertmanager resend"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self, flush_timeout: float = 2.0) -> None:
        """Try once more to deliver what is queued, then close the HTTP client."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(self._flush(t) for t in self._targets), return_exceptions=True), flush_timeout)
        if self._own_client:
            await self._http.aclose()

    async def _flush(self, target: _Target) -> None:
        while target.queue:
            if not await self._send_batch(target):
                return

    def _payloads(self, keys: list[AlertKey], now: float) -> list[dict[str, object]]:
        out = []
        for key in keys:
            alert = self._active.get(key)
            if alert is not None:
                out.append(alert.payload(now + 4 * self.resend_interval))
                continue
            alert = self._resolved.get(key)
            if alert is not None and alert.ends_at is not None:
                out.append(alert.payload(alert.ends_at))
        return out

    async def _send_batch(self, target: _Target) -> bool:
        """POST the head of the queue. True when it was delivered (or rejected for good)."""
        keys = []
        for key in target.queue:
            keys.append(key)
            if len(keys) >= self.batch_max:
                break
        body = self._payloads(keys, self._clock())
        if body:
            try:
                response = await self._http.post(target.endpoint, json=body)
            except (httpx.HTTPError, OSError) as exc:
                return self._failed(target, len(body), f"{type(exc).__name__}: {exc}", retry=True)
            if response.status_code >= 300:
                retry = response.status_code >= 500 or response.status_code == 429
                detail = response.text[:200].strip()
                if not retry:
                    log.error("Alertmanager %s rejected %d alerts: %s %s", target.url, len(body), response.status_code, detail)
                    for key in keys:
                        target.queue.pop(key, None)
                return self._failed(target, len(body), f"HTTP {response.status_code}: {detail}", retry=retry)
            target.sent += len(body)
        target.up = True
        target.last_error = ""
        for key in keys:
            target.queue.pop(key, None)
        return True

    def _failed(self, target: _Target, count: int, error: str, *, retry: bool) -> bool:
        target.failed += count
        target.up = False
        target.last_error = error
        return not retry

    async def _sender(self, target: _Target) -> None:
        backoff = self.backoff_min
        while True:
            if not target.queue:
                target.wake.clear()
                await target.wake.wait()
            if await self._send_batch(target):
                backoff = self.backoff_min
                continue
            log.warning("Alertmanager %s: %s (retry in %.2fs)", target.url, target.last_error, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max)

    async def _scheduler(self) -> None:
        """Resend firing and recently resolved alerts; expire one-off event alerts."""
        while True:
            now = self._clock()
            for key, alert in list(self._active.items()):
                if alert.expires_at is not None and alert.expires_at <= now:
                    self.resolve(key, at=alert.expires_at)
            for key, alert in list(self._resolved.items()):
                if alert.ends_at is not None and alert.ends_at + self.resolved_resend_for <= now:
                    del self._resolved[key]
                    self._next_resend.pop(key, None)
            for key, due in list(self._next_resend.items()):
                if key not in self._active and key not in self._resolved:
                    del self._next_resend[key]
                elif due <= now:
                    self._queue(key)
            wake_at = [due for due in self._next_resend.values()]
            wake_at += [a.expires_at for a in self._active.values() if a.expires_at is not None]
            wake_at += [a.ends_at + self.resolved_resend_for for a in self._resolved.values() if a.ends_at]
            delay = max(0.0, min(wake_at) - self._clock()) if wake_at else 3600.0
            self._schedule_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._schedule_changed.wait(), timeout=min(delay, 3600.0) + 0.001)
