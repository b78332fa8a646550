"""``/metrics`` and ``/health`` of the load simulator's engines, one port per engine as on a
real node (each vLLM API server listens on its own port).

The families are vLLM's (``collector.sim.metrics.VllmMetrics``). They are brought up to date
when a scrape arrives, from the engine's counters, not on every step: the step loop must stay
cheap, and a scraper cannot tell the difference. Each server runs in a daemon thread, so a
scrape never delays a step deadline by more than the GIL's switch interval.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector.sim.load import Counters, EngineLoad
from collector.sim.metrics import VllmMetrics


class EngineMetrics:
    """vLLM's families for one simulated engine, caught up from its counters at each scrape."""

    def __init__(self, engine: EngineLoad) -> None:
        self.engine = engine
        self.metrics = VllmMetrics(engine_index=0, model_name=engine.cfg.model, connectors=False)  # a plain deployment
        self._seen = Counters()
        self._lock = threading.Lock()

    def page(self) -> bytes:
        with self._lock:
            e, m, seen = self.engine, self.metrics, self._seen
            c = e.counters
            m.running.set(e.running_now)
            m.waiting.set(0)
            m.waiting_capacity.set(0)
            m.waiting_deferred.set(0)
            m.kv_usage.set(e.last_kv_usage)
            m.prompt_tokens.inc(c.prompt_tokens - seen.prompt_tokens)
            m.generation_tokens.inc(c.generation_tokens - seen.generation_tokens)
            m.success.inc(c.finished - seen.finished)
            cfg = e.cfg
            m.server.finished(
                c.finished - seen.finished, prompt_len=cfg.isl, output_len=cfg.osl, max_tokens=cfg.osl, step_s=1.0 / cfg.steps_per_second
            )
            for _ in range(min(c.steps - seen.steps, 10_000)):
                m.iteration_tokens.observe(e.running_now or 1)
            seen.prompt_tokens, seen.generation_tokens = c.prompt_tokens, c.generation_tokens
            seen.finished, seen.steps = c.finished, c.steps
            return generate_latest(m.registry)


def _handler(slot: list[EngineMetrics]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as vLLM's server does: HTTP/1.0 (the default) closed every connection,
        # so the scraper under test paid a TCP connect per GET that it never pays on a node.
        protocol_version = "HTTP/1.1"
        # vLLM's server (uvicorn on asyncio) sends with TCP_NODELAY, as asyncio sets it on every
        # TCP socket: with Nagle on, a page's last segment waited for the scraper's delayed ACK
        # (about 40 ms a scrape on a kept-alive connection), which no real engine makes it wait.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if self.path == "/metrics" and slot:
                body = slot[0].page()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            elif self.path == "/health" and slot:
                body = b""
                self.send_response(200)
            else:
                body = b"not found"
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class MetricsServers:
    """``n`` HTTP servers on ``host``, ports from ``first_port`` on (0: any free ones).

    The ports are bound first, so each engine's fingerprint can name its own; ``attach`` then
    gives each server its engine, and pages are served from then on (404 before)."""

    def __init__(self, n: int, *, host: str = "127.0.0.1", first_port: int = 0) -> None:
        self.host = host
        self._slots: list[list[EngineMetrics]] = [[] for _ in range(n)]
        self.servers: list[ThreadingHTTPServer] = []
        for i in range(n):
            server = ThreadingHTTPServer((host, first_port + i if first_port else 0), _handler(self._slots[i]))
            server.daemon_threads = True
            self.servers.append(server)
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True) for s in self.servers]

    def ports(self) -> list[int]:
        return [int(s.server_address[1]) for s in self.servers]

    def attach(self, engines: list[EngineLoad]) -> dict[str, str]:
        """Serve ``engines[i]`` on server ``i``; returns each engine's base URL."""
        urls = {}
        for slot, engine, port in zip(self._slots, engines, self.ports(), strict=True):
            slot.append(EngineMetrics(engine))
            urls[engine.name] = f"http://{self.host}:{port}"
        for t in self._threads:
            t.start()
        return urls

    def close(self) -> None:
        for s, t in zip(self.servers, self._threads, strict=True):
            if t.is_alive():
                s.shutdown()
            s.server_close()
