"""KeepAliveGet against real HTTP servers on loopback (the standard library's, as vLLM's
uvicorn behaves where it matters: HTTP/1.1 keep-alive, idle connections closed by the server)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collector.sources.http_get import HttpGetError, KeepAliveGet

PAGE = (Path(__file__).resolve().parent.parent / "fixtures" / "vllm-metrics" / "idle.txt").read_bytes()


class Server:
    """A loopback server that counts the connections it accepted."""

    def __init__(self, *, keep_alive: bool = True, delay: float = 0.0, body: bytes = PAGE, chunked: bool = False) -> None:
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_GET(self) -> None:
                if delay:
                    time.sleep(delay)
                data = body if self.path.endswith("/metrics") else b""
                self.send_response(200 if self.path.endswith(("/metrics", "/health")) else 404)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(data), 4096):
                        part = data[i : i + 4096]
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def raw_server(*answers: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """A raw loopback server: each connection's requests are answered with ``answers`` in
    turn (each sent whole, in one segment), then the connection is closed without a word (as
    a server's idle timeout does). Yields its URL and every request it read, whole."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def one(conn: socket.socket) -> None:
        with conn:
            for raw in answers:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                seen.append(buf)
                conn.sendall(raw)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        listener.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def test_gets_reuse_one_connection(server: Server) -> None:
    get = KeepAliveGet(server.url)
    for _ in range(5):
        assert get.get("/metrics", 2.0) == (200, PAGE)
        assert get.get("/health", 2.0) == (200, b"")
    assert get.connects == 1
    assert server.connections == 1
    assert get.get("/nope", 2.0)[0] == 404
    get.close()


def test_a_server_that_closes_each_connection_is_still_read() -> None:
    s = Server(keep_alive=False)
    try:
        get = KeepAliveGet(s.url)
        for _ in range(3):
            assert get.get("/metrics", 2.0) == (200, PAGE)
        assert get.connects == 3
    finally:
        s.close()


def test_a_chunked_body_is_read_whole() -> None:
    s = Server(chunked=True)
    try:
        assert KeepAliveGet(s.url).get("/metrics", 2.0) == (200, PAGE)
    finally:
        s.close()


def test_a_kept_connection_the_server_dropped_is_retried_once_on_a_fresh_one() -> None:
    # Answers one request per connection with keep-alive headers, then closes the socket
    # without saying so (an idle timeout): the client learns it on its next request.
    with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok") as (url, seen):
        get = KeepAliveGet(url)
        assert get.get("/health", 2.0) == (200, b"ok")
        time.sleep(0.1)  # the server has closed it by now
        assert get.get("/health", 2.0) == (200, b"ok")
        assert get.connects == 2
        assert len(seen) == 2


def test_refused_timed_out_and_oversized_are_errors_that_say_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
    with pytest.raises(HttpGetError, match="ConnectionRefusedError"):
        KeepAliveGet(f"http://127.0.0.1:{port}").get("/metrics", 1.0)
    slow = Server(delay=0.5)
    try:
        with pytest.raises(HttpGetError, match="timed out after 0.1 s"):
            KeepAliveGet(slow.url).get("/metrics", 0.1)
    finally:
        slow.close()
    big = Server()
    try:
        with pytest.raises(HttpGetError, match="larger than 1000 bytes"):
            KeepAliveGet(big.url, max_body=1000).get("/metrics", 2.0)
    finally:
        big.close()


def test_a_path_prefix_of_the_base_url_is_kept() -> None:
    s = Server()
    try:
        assert KeepAliveGet(s.url + "/engine0/").get("/metrics", 2.0) == (200, PAGE)
    finally:
        s.close()
    with pytest.raises(ValueError):
        KeepAliveGet("unix:///tmp/x.sock")


def test_a_body_cut_short_of_its_length_is_an_error_not_a_page() -> None:
    with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + PAGE[:50]) as (url, _):
        with pytest.raises(HttpGetError, match="cut short"):
            KeepAliveGet(url).get("/metrics", 2.0)


def test_a_body_with_neither_length_nor_chunks_runs_to_the_close() -> None:
    with raw_server(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE) as (url, _):
        get = KeepAliveGet(url)
        assert get.get("/metrics", 2.0) == (200, PAGE)
        assert get.get("/metrics", 2.0) == (200, PAGE)  # (a fresh connection each time)
        assert get.connects == 2


def test_an_http_1_0_body_cut_short_of_its_length_is_an_error() -> None:
    with raw_server(b"HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n" + PAGE[:50]) as (url, _):
        with pytest.raises(HttpGetError, match="cut short"):
            KeepAliveGet(url).get("/metrics", 2.0)


def test_an_answer_that_is_not_http_is_an_error_that_says_so() -> None:
    with raw_server(b"SSH-2.0-OpenSSH_9.2\r\n" + b"\0" * 64) as (url, _):
        with pytest.raises(HttpGetError, match="not an HTTP answer"):
            KeepAliveGet(url).get("/metrics", 2.0)


def test_a_chunked_body_over_the_bound_is_an_error_not_memory() -> None:
    s = Server(chunked=True)
    try:
        with pytest.raises(HttpGetError, match="larger than 1000 bytes"):
            KeepAliveGet(s.url, max_body=1000).get("/metrics", 2.0)
    finally:
        s.close()


def test_the_request_names_its_host_and_asks_for_text() -> None:
    with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") as (url, seen):
        assert KeepAliveGet(url + "/p").get("/metrics", 2.0) == (200, b"ok")
    head = seen[0].decode()
    port = url.rsplit(":", 1)[1]
    assert head.startswith("GET /p/metrics HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n" in head and "\r\nAccept: text/plain\r\n" in head and head.endswith("\r\n\r\n")


def test_bytes_after_a_whole_answer_are_not_its_body_and_the_connection_is_not_reused() -> None:
    # A server that sends more than it was asked for (a second answer, or junk) in the same
    # segment: the answer is what its length says, and the connection, out of step, is dropped.
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirstHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEXTRA"
    with raw_server(extra, extra) as (url, _):
        get = KeepAliveGet(url)
        assert get.get("/metrics", 2.0) == (200, b"first")
        assert get.get("/metrics", 2.0) == (200, b"first")
        assert get.connects == 2
    with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok\0\0garbage") as (url, _):
        assert KeepAliveGet(url).get("/health", 2.0) == (200, b"ok")


def test_an_interim_answer_is_skipped_for_the_final_one() -> None:
    # 103 Early Hints (or 100 Continue) in its own segment before the answer: the next GET must
    # not read this one's final answer (the connection would stay one answer behind for good).
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for i in range(2):
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
                time.sleep(0.05)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nanswer-%d" % i)
            time.sleep(0.2)

    threading.Thread(target=serve, daemon=True).start()
    try:
        get = KeepAliveGet(f"http://127.0.0.1:{port}")
        assert get.get("/metrics", 2.0) == (200, b"answer-0")
        assert get.get("/health", 2.0) == (200, b"answer-1")
        assert get.connects == 1
    finally:
        listener.close()


def test_a_reset_after_part_of_the_answer_is_an_error_not_a_retry() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.recv(65536)
            if len(accepted) == 1:  # the first connection answers whole and stays open
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                conn.recv(65536)
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")  # part of the next answer, then a reset
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        get = KeepAliveGet(f"http://127.0.0.1:{port}")
        assert get.get("/health", 2.0) == (200, b"ok")
        with pytest.raises(HttpGetError, match="reset after part of the answer|cut short"):
            get.get("/health", 2.0)
        assert get.connects == 1  # not retried: the server had begun to answer
    finally:
        listener.close()


def test_a_base_url_is_written_in_ascii_or_refused_when_made() -> None:
    with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") as (url, seen):
        assert KeepAliveGet(url + "/café engine").get("/metrics", 2.0) == (200, b"ok")
    assert [r.split(b"\r\n")[0] for r in seen] == [b"GET /caf%C3%A9%20engine/metrics HTTP/1.1"]
    # a host name the resolver cannot encode (a label over 63 characters) is a failed GET, not
    # an exception that would stop the source
    with pytest.raises(HttpGetError, match="UnicodeError"):
        KeepAliveGet("http://" + "x" * 70 + ".example:80").get("/metrics", 1.0)
