"""Blocking HTTP/1.1 GETs of one engine on one kept-alive connection, for a scrape thread.

The answer is parsed by ``httptools`` (llhttp, the parser uvicorn serves vLLM with, installed
with ``uvicorn[standard]``); this module only writes the request line and moves bytes. Why not
the standard library's ``http.client``: it parses every answer's headers with the ``email``
package. CPU of the scraping process per scrape's two GETs (``/metrics``, a 52 kB vLLM page, and
``/health``) on a kept connection: this client 0.062 ms, ``http.client`` 0.224 ms, httpx's
``Client`` 1.147 ms (``bench/bench_scrape.py``, docs/metrics-source.md).

Failures are ``HttpGetError``s with the reason (refused, timed out, reset, not HTTP). A kept
connection the server closed while idle (vLLM's uvicorn drops idle ones after 5 s) fails on
its next request before anything was read: that one request is retried once on a fresh
connection. Bodies are bounded (``max_body``): a page larger than that is an error, not memory;
a body cut short of its ``Content-Length`` is an error, not a page.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import quote, urlsplit

import httptools

from collector.sources.base import SourceError

__all__ = ["MAX_BODY", "HttpGetError", "KeepAliveGet"]

MAX_BODY = 16 * 1024 * 1024  # a vLLM page is ~50-85 kB; DP=8 with connectors stays far below
_RECV = 256 * 1024  # bytes asked of the socket at a time (a whole page, most often)


class HttpGetError(SourceError):
    """One GET failed: no answer, a broken one, or a body over the bound."""


class _Stale(Exception):
    """A kept connection answered nothing: the server closed it while it sat idle."""


class _Answer:
    """The parser's callbacks: the body's parts, and whether the answer is whole."""

    __slots__ = ("done", "extra", "framed", "headed", "keep", "over", "parser", "parts", "size", "started", "status", "the_max")

    def __init__(self, the_max: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.the_max = the_max
        self.started = False  # a byte of an answer came
        self.headed = False  # its headers are whole
        self.framed = False  # it has a Content-Length or chunks (else its body ends at the close)
        self.done = False
        self.status = 0
        self.extra = False  # bytes came after the answer: the connection is not reused
        self.over = False
        self.keep = False  # the connection may carry the next request (asked of the parser with the headers whole)
        self.parser: httptools.HttpResponseParser | None = None

    def on_message_begin(self) -> None:
        if self.done:
            self.extra = True
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.done:
            return
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        if self.done:
            return
        self.headed = True
        if self.parser is not None:  # (llhttp forgets it once the message is complete)
            self.keep = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.done:
            return
        self.size += len(body)
        if self.size > self.the_max:
            self.over = True
        elif not self.over:
            self.parts.append(body)

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self.parser is not None and 100 <= self.parser.get_status_code() < 200:
            self.headed = self.framed = False  # an interim answer (100, 103): the final one follows
            return
        self.done = True
        self.status = self.parser.get_status_code() if self.parser is not None else 0


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
        # The request line and Host header are ASCII: the path percent-quoted, a name's
        # non-ASCII labels IDNA-encoded; a URL that cannot be written so is refused here, never
        # at a scrape (where any error but HttpGetError would stop every engine's scrapes).
        try:
            self.prefix = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=~-._")
            host = self.host if self.host.isascii() else self.host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"not a usable URL: {base_url!r}: {exc}") from exc
        self.max_body = max_body
        self._sock: socket.socket | None = None
        self._tls: ssl.SSLContext | None = None
        host = f"[{host}]" if ":" in host else host
        default = self.port == (443 if self.scheme == "https" else 80)
        self._host_header = host if default else f"{host}:{self.port}"
        self.connects = 0  # connections opened (a kept-alive scraper opens one per engine)

    def _connect(self, timeout: float) -> socket.socket:
        self.connects += 1
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            # a request is one send: no small segment to hold back (as curl and Prometheus do)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context()
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        return sock

    def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        """``(status, body)`` of ``GET {base}{path}``; ``timeout`` bounds each wait on the socket."""
        url = f"{self.scheme}://{self.host}:{self.port}{self.prefix}{path}"
        if not path.startswith("/") or not path.isascii() or not path.isprintable() or " " in path:
            raise ValueError(f"not a path to ask for: {path!r}")  # (the source's own constants)
        request = (
            f"GET {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\nAccept: text/plain\r\nAccept-Encoding: identity\r\n\r\n"
        ).encode("ascii")
        for attempt in (0, 1):
            reused = self._sock is not None
            try:
                sock = self._sock
                if sock is None:
                    sock = self._sock = self._connect(timeout)
                else:
                    sock.settimeout(timeout)
                return self._exchange(sock, request, url)
            except _Stale as exc:
                self.close()
                if reused and attempt == 0:
                    continue
                raise HttpGetError(f"GET {url}: the server closed the connection without answering") from exc
            except HttpGetError:
                self.close()
                raise
            except TimeoutError as exc:
                self.close()
                raise HttpGetError(f"GET {url}: timed out after {timeout:g} s") from exc
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:
                self.close()
                if reused and attempt == 0:  # (the request met a connection closed while idle)
                    continue
                raise HttpGetError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
            except (OSError, UnicodeError) as exc:  # (UnicodeError: a host name the resolver cannot encode)
                self.close()
                raise HttpGetError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, sock: socket.socket, request: bytes, url: str) -> tuple[int, bytes]:
        """One request and its whole answer on ``sock``; the connection is closed after an
        answer that says so (or that ends with the connection)."""
        sock.sendall(request)
        answer = _Answer(self.max_body)
        parser = answer.parser = httptools.HttpResponseParser(answer)
        while not answer.done:
            try:
                data = sock.recv(_RECV)
            except (ConnectionResetError, ConnectionAbortedError) as exc:
                if not answer.started:
                    raise _Stale from exc
                raise HttpGetError(f"GET {url}: the connection was reset after part of the answer") from exc
            if not data:
                if not answer.started:
                    raise _Stale
                if answer.headed and not answer.framed:  # (a body with neither a length nor chunks ends with its connection)
                    break
                if not answer.headed:
                    raise HttpGetError(f"GET {url}: the headers were cut short (the connection closed)")
                raise HttpGetError(f"GET {url}: the body was cut short of its length (the connection closed after {answer.size} bytes)")
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade as exc:
                raise HttpGetError(f"GET {url}: the server switched protocols") from exc
            except httptools.HttpParserError as exc:
                if answer.done:  # (bytes after a whole answer)
                    answer.extra = True
                    break
                raise HttpGetError(f"GET {url}: not an HTTP answer: {exc}") from exc
            if answer.over:
                raise HttpGetError(f"GET {url}: body larger than {self.max_body} bytes")
        status = answer.status if answer.done else parser.get_status_code()
        answer.parser = None
        if not answer.done or not answer.keep or answer.extra:
            self.close()
        return status, b"".join(answer.parts)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
