"""Request bodies are size-limited before any handler reads them (413), whatever the route.

A pure ASGI middleware, not Starlette's BaseHTTPMiddleware: that one re-streams every response
through a memory channel, which costs the multi-megabyte snapshot responses real time.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BODY = 64 * 1024

Scope = dict[str, Any]


async def _reply(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app: Any, *, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _reply(send, 400, "bad Content-Length")
                return
            if declared > self.max_body:
                await _reply(send, 413, f"request body over {self.max_body} bytes")
                return
        # A chunked body has no declared length: count what arrives; past the limit, answer
        # 413 ourselves and tell the app the client left (a raised error would be caught by the
        # body parser and turned into a 400).
        seen = 0
        started = False
        rejected = False

        async def limited_receive() -> Any:
            nonlocal seen, rejected
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_body:
                    if not started and not rejected:
                        rejected = True
                        await _reply(send, 413, f"request body over {self.max_body} bytes")
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg: Any) -> None:
            nonlocal started
            if rejected:
                return  # the 413 is already out
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        await self.app(scope, limited_receive, guarded_send)
