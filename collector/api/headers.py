"""Headers every response carries, whatever the route: ``X-Content-Type-Options: nosniff``, so a
browser never sniffs a JSON body (which quotes engine log lines) into HTML or script.

A pure ASGI middleware, as ``body_limit``: Starlette's BaseHTTPMiddleware would re-stream the
multi-megabyte snapshot responses.
"""

from __future__ import annotations

from typing import Any

EXTRA = ((b"x-content-type-options", b"nosniff"),)


class SecurityHeaders:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                names = {name.lower() for name, _ in msg.get("headers") or []}
                added = [(n, v) for n, v in EXTRA if n not in names]
                if added:
                    msg = {**msg, "headers": [*(msg.get("headers") or []), *added]}
            await send(msg)

        await self.app(scope, receive, with_headers)
