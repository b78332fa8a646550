"""A stand-in API server over real HTTP on loopback, answering from given responses: a pod list
(``GET /api/v1/pods``) and watches (``?watch=1``, newline-delimited JSON events, chunked), each
watch playing one script. Requests are kept for assertions. Nothing here runs a cluster: it is
what the discovery tests use because no kube-apiserver can be installed on the test machine."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class RecordedApi:
    lists: list[dict[str, Any]] = field(default_factory=list)  # bodies of successive lists (the last repeats)
    # each watch plays one script: dicts are events, floats are pauses, "410" answers 410 Gone,
    # "hang" keeps the stream open; at the end of a script the server ends the watch
    watches: list[list[Any]] = field(default_factory=list)
    list_status: int = 200  # set to 500/403 to make lists and watches fail
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    _server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                parts = urlsplit(target)
                req = Request(method, parts.path, dict(parse_qsl(parts.query)), headers)
                self.requests.append(req)
                if req.query.get("watch") == "1":
                    await self._watch(writer)
                    return
                await self._list(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _list(self, writer: asyncio.StreamWriter) -> None:
        if self.list_status != 200:
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "pods is forbidden", "code": self.list_status})
            self._respond(writer, self.list_status, body.encode())
            return
        body = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        self._respond(writer, 200, json.dumps(body).encode())
        await writer.drain()

    def _respond(self, writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    async def _watch(self, writer: asyncio.StreamWriter) -> None:
        if self.list_status != 200:
            await self._list(writer)
            return
        script = self.watches.pop(0) if self.watches else ["hang"]
        if script and script[0] == "410":
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410})
            self._respond(writer, 410, body.encode())
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        for step in script:
            if step == "hang":
                await asyncio.sleep(3600)
            elif isinstance(step, float):
                await asyncio.sleep(step)
            else:
                line = json.dumps(step).encode() + b"\n"
                writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
