"""Blocking HTTP/1.1 GETs of one engine on one kept-alive connection (``http.client``), for a
scrape thread.

Why not httpx on the event loop: per scrape, the standard library's client on a kept connection
costs the sidecar's process a fraction of what httpx's clients do (``bench/bench_scrape.py``
measures the three); nothing here is a hand-written HTTP parser.

Failures are ``ScrapeError``s with the reason (refused, timed out, reset, not HTTP). A kept
connection the server closed while idle (vLLM's uvicorn drops idle ones after 5 s) fails on
its next request before anything was read: that one request is retried once on a fresh
connection. Bodies are bounded (``max_body``): a page larger than that is an error, not memory;
a body cut short of its ``Content-Length`` is an error, not a page.
"""

from __future__ import annotations

import http.client
import ssl
from urllib.parse import urlsplit

from collector.sources.base import SourceError

MAX_BODY = 16 * 1024 * 1024  # a vLLM page is ~50-85 kB; DP=8 with connectors stays far below


class HttpGetError(SourceError):
    """One GET failed: no answer, a broken one, or a body over the bound."""


# Raised on a kept connection the server closed while it sat idle: nothing of the request was
# answered, so sending it again on a fresh connection is safe (a GET has no side effects).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class KeepAliveGet:
    """GETs of paths under one base URL (``http://host:port[/prefix]``). Not thread-safe: one
    engine's scrapes never overlap, and each engine has its own."""

    def __init__(self, base_url: str, *, max_body: int = MAX_BODY) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.max_body = max_body
        self._conn: http.client.HTTPConnection | None = None
        self.connects = 0  # connections opened (a kept-alive scraper opens one per engine)

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        self.connects += 1
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        """``(status, body)`` of ``GET {base}{path}``; ``timeout`` bounds each wait on the socket."""
        url = f"{self.scheme}://{self.host}:{self.port}{self.prefix}{path}"
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._conn or self._connect(timeout)
            self._conn = conn
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.timeout = timeout
            try:
                conn.request("GET", self.prefix + path, headers={"Accept": "text/plain"})
                response = conn.getresponse()
                length = response.length  # Content-Length; None when chunked or until close
                if length is not None and length > self.max_body:
                    self.close()
                    raise HttpGetError(f"GET {url}: body larger than {self.max_body} bytes")
                # read() of a known length raises IncompleteRead on a body cut short of it;
                # read(amt) would hand back the part that came
                body = response.read() if length is not None else response.read(self.max_body + 1)
                if len(body) > self.max_body:
                    self.close()
                    raise HttpGetError(f"GET {url}: body larger than {self.max_body} bytes")
                if response.will_close:
                    self.close()
                return response.status, body
            except _STALE as exc:
                self.close()
                if reused and attempt == 0:
                    continue
                raise HttpGetError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
            except TimeoutError as exc:
                self.close()
                raise HttpGetError(f"GET {url}: timed out after {timeout:g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise HttpGetError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
