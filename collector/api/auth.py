"""Bearer-token checks. Writes always need the token; reads need it when the sidecar is bound
beyond loopback. Compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request, status


def _presented(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    return None


def check_token(request: Request, *, write: bool) -> None:
    ctx = request.app.state.ctx
    token = ctx.settings.api_token.get_secret_value() if ctx.settings.api_token else None
    if token is not None and not token.strip():
        token = None  # a blank token is no token (settings refuse one; this holds without them)
    needed = write or not ctx.settings.loopback_only
    if not needed:
        # Loopback reads need no token, but a token that is presented and wrong is a
        # misconfigured client: say so (401) rather than let it believe it is authorised.
        got = _presented(request)
        if got is not None and (token is None or not hmac.compare_digest(got.encode(), token.encode())):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "wrong bearer token" if token is not None else "a bearer token was sent but no api_token is configured",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return
    if token is None:
        if write:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "writes are disabled: set api_token to enable them")
        raise HTTPException(status.HTTP_403_FORBIDDEN, "api_token is required when bound beyond loopback")
    got = _presented(request)
    if got is None or not hmac.compare_digest(got.encode(), token.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


# async: no I/O here, and a sync dependency would cost every request a thread-pool hop
async def require_read(request: Request) -> None:
    check_token(request, write=False)


async def require_write(request: Request) -> None:
    check_token(request, write=True)
