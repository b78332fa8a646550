"""dcgm-exporter source: the node's GPU gauges read from dcgm-exporter's ``/metrics`` every
``interval`` (``gpu_metrics: dcgm``), instead of the sidecar polling NVML itself. NVML then
listens for Xid events only, and the kernel log stays the other Xid witness.

A scrape that fails (exporter down, timeout, a page that does not parse) emits nothing for
that round and shows in this source's status (``/healthz``, ``flightrec_source_up``): GPU
samples are missing, not zero. The page is parsed by ``collector.parsers.dcgm``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from collector.model import SourceStatus
from collector.parsers.dcgm import parse_page
from collector.parsers.prom_text import MetricsParseError
from collector.sources.base import Sink

ClientFactory = Callable[[], httpx.AsyncClient]


class DcgmSource:
    name = "dcgm"

    def __init__(
        self,
        url: str,
        *,
        interval: float = 1.0,
        timeout: float = 2.0,
        client_factory: ClientFactory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self._client_factory = client_factory or (lambda: httpx.AsyncClient(timeout=timeout))
        self.clock = clock
        self.up: bool | None = None
        self.last_error = ""
        self.last_ok: float | None = None
        self.scrapes = 0
        self.errors = 0
        self.gpus = 0
        self.gpu_pods: dict[int, tuple[str, str]] = {}  # GPU index -> (namespace, pod), as the exporter maps them

    def status(self) -> SourceStatus:
        return SourceStatus(
            name=self.name,
            up=bool(self.up) if self.up is not None else True,
            reason="" if self.up or self.up is None else self.last_error,
            last_ok=self.last_ok,
            errors=self.errors,
            details={
                "url": self.url,
                "scrapes": self.scrapes,
                "errors_total": self.errors,
                "gpus": self.gpus,
                "last_error": self.last_error or None,
                "gpu_pods": {str(i): f"{ns}/{pod}" for i, (ns, pod) in sorted(self.gpu_pods.items())},
            },
        )

    async def scrape_once(self, client: httpx.AsyncClient, sink: Sink) -> None:
        self.scrapes += 1
        try:
            resp = await client.get(self.url)
            if resp.status_code != 200:
                raise MetricsParseError(f"HTTP {resp.status_code}")
            page = parse_page(resp.text, self.clock())
            samples = page.samples
        except (httpx.HTTPError, MetricsParseError) as exc:
            self.errors += 1
            self.up, self.last_error = False, f"{self.url}: {type(exc).__name__}: {exc}"
            return
        if not samples:
            self.errors += 1
            self.up, self.last_error = False, f"{self.url}: no DCGM_FI_DEV_* series with a gpu label"
            return
        self.up, self.last_error, self.last_ok, self.gpus = True, "", time.time(), len(samples)
        self.gpu_pods = page.pods
        for s in samples:
            sink.emit(s)

    async def run(self, sink: Sink) -> None:
        loop = asyncio.get_running_loop()
        async with self._client_factory() as client:
            next_tick = loop.time()
            while True:
                await self.scrape_once(client, sink)
                next_tick += self.interval
                delay = next_tick - loop.time()
                if delay < 0:  # a slow exporter: skip ticks, never burst
                    next_tick, delay = loop.time(), 0.0
                await asyncio.sleep(delay)
