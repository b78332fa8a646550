"""What one scrape of a real vLLM page costs the sidecar's process, all included, and by part.

    python bench/bench_scrape.py [--page tests/fixtures/vllm-metrics/load-running-waiting.txt] [--seconds 10]

A real HTTP/1.1 keep-alive server in another process (the standard library's, as the load
simulator's, sending with TCP_NODELAY as vLLM's uvicorn does) serves the captured page at
``/metrics`` and an empty ``/health``. In this process:

- whole scrape: ``VllmMetricsSource`` scraping that one engine 10 times a second for
  ``--seconds``, with its default client (kept-alive connections in a thread, answers parsed by
  ``httptools``: ``collector.sources.http_get``) and with an ``httpx.AsyncClient`` on the loop
  (what it used before); CPU time of this process (all threads) per scrape, less the same loop
  idling for the same time;
- by part, CPU per call in a tight loop: the two GETs through our client, through the standard
  library's ``http.client`` on a kept connection (what it used before), through httpx's
  ``Client`` and ``AsyncClient``, and our page parser alone, beside ``prometheus_client``'s
  parser on the same page.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collector.parsers.prom_text import parse
from collector.sources.http_get import KeepAliveGet
from collector.sources.vllm_metrics import WANTED, VllmMetricsSource

HERE = Path(__file__).resolve().parents[1]
SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
page = open(sys.argv[1], "rb").read()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        body = page if self.path == "/metrics" else b""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
"""


class _Engine:
    def __init__(self, url: str) -> None:
        self.name = "bench"
        self.url = url


class _CountingSink:
    def __init__(self) -> None:
        self.scrapes = 0

    def emit(self, item: object) -> None:
        self.scrapes += 1


def _cpu_per_call(fn: Callable[[], Any], n: int) -> float:
    fn()
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n


def _whole(url: str, seconds: float, httpx_client: bool) -> tuple[float, int]:
    """CPU seconds per scrape of the source at 10 scrapes/s, less an idle loop's."""

    async def run(source: VllmMetricsSource | None) -> tuple[float, int]:
        sink = _CountingSink()
        t0 = time.process_time()
        if source is None:
            await asyncio.sleep(seconds)
        else:
            task = asyncio.create_task(source.run(sink))
            await asyncio.sleep(seconds)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        return time.process_time() - t0, sink.scrapes

    factory = (lambda: httpx.AsyncClient(trust_env=False)) if httpx_client else None
    source = VllmMetricsSource(engines=[_Engine(url)], interval=0.1, client_factory=factory)
    cpu, scrapes = asyncio.run(run(source))
    idle, _ = asyncio.run(run(None))
    return (cpu - idle) / max(scrapes, 1), scrapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--page", type=Path, default=HERE / "tests/fixtures/vllm-metrics/load-running-waiting.txt")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=300)
    args = p.parse_args()
    page = args.page.read_bytes()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.page)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    url = f"http://127.0.0.1:{port}"
    print(f"page {args.page.name}: {len(page) / 1024:.1f} kB; load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    try:
        for label, use_httpx in (
            ("whole scrape, default client (httptools, in a thread)", False),
            ("whole scrape, httpx.AsyncClient on the loop", True),
        ):
            per, n = _whole(url, args.seconds, use_httpx)
            print(f"{label:58} {per * 1e3:7.3f} ms CPU per scrape ({n} scrapes)")

        keep = KeepAliveGet(url)

        def ours() -> None:
            keep.get("/metrics", 2.0)
            keep.get("/health", 2.0)

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)

        def stdlib() -> None:
            for path in ("/metrics", "/health"):
                conn.request("GET", path, headers={"Accept": "text/plain"})
                conn.getresponse().read()

        sync = httpx.Client(trust_env=False)

        def httpx_sync() -> None:
            assert sync.get(url + "/metrics", timeout=2.0).text
            sync.get(url + "/health", timeout=2.0)

        async def httpx_async(n: int) -> float:
            async with httpx.AsyncClient(trust_env=False) as client:

                async def one() -> None:
                    r, _ = await asyncio.gather(client.get(url + "/metrics", timeout=2.0), client.get(url + "/health", timeout=2.0))
                    assert r.text

                await one()
                t0 = time.process_time()
                for _ in range(n):
                    await one()
                return (time.process_time() - t0) / n

        text = page.decode()
        rows = [
            ("GET /metrics + /health, our client (httptools) kept alive", _cpu_per_call(ours, args.repeat)),
            ("GET /metrics + /health, http.client kept alive", _cpu_per_call(stdlib, args.repeat)),
            ("GET /metrics + /health, httpx.Client", _cpu_per_call(httpx_sync, args.repeat)),
            ("GET /metrics + /health, httpx.AsyncClient", asyncio.run(httpx_async(args.repeat))),
            ("our parser (collector.parsers.prom_text)", _cpu_per_call(lambda: parse(text, WANTED), args.repeat)),
            ("prometheus_client's parser", _cpu_per_call(lambda: list(text_string_to_metric_families(text)), max(20, args.repeat // 10))),
        ]
        for label, sec in rows:
            print(f"{label:58} {sec * 1e3:7.3f} ms CPU per call")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
