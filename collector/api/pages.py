"""HTML pages: a snapshot list and a page per snapshot (the data comes from the JSON API)."""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from collector.api.auth import require_read


def _asset(name: str) -> str:
    return resources.files("collector.web").joinpath(name).read_text()


def add_pages(app: FastAPI, ctx: Any) -> None:
    @app.get("/", include_in_schema=False)
    def index() -> RedirectResponse:
        return RedirectResponse("/snapshots")

    @app.get("/snapshots", include_in_schema=False, response_class=HTMLResponse)
    def snapshots_page(request: Request) -> HTMLResponse:
        require_read(request)
        return HTMLResponse(_asset("list.html"))

    @app.get("/snapshots/{snapshot_id}", name="snapshot_page", include_in_schema=False, response_class=HTMLResponse)
    def snapshot_page(snapshot_id: int, request: Request) -> HTMLResponse:
        require_read(request)
        page = _asset("snapshot.html").replace("{{SNAPSHOT_ID}}", html.escape(str(snapshot_id)))
        return HTMLResponse(page)
