"""HTML pages: a snapshot list, a page per snapshot and per incident, and their static assets.

The pages are shells with no data in them: the data comes from the JSON API, which enforces the
token. So the shells are served without one, and a page opened as ``/snapshots/12?token=T``
keeps ``T`` in the tab's sessionStorage and sends it as a bearer token (see flightrec.js).
A strict Content-Security-Policy allows only this origin's scripts: no inline script, no
outside resource, so a log line that looks like HTML can do nothing even if it were inserted
as markup (it is not: the pages set text only).
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Path
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from collector.storage.db import StorageError
from collector.storage.repo import NotFound

ASSETS = {
    "flightrec.js": "text/javascript; charset=utf-8",
    "snapshot.js": "text/javascript; charset=utf-8",
    "list.js": "text/javascript; charset=utf-8",
    "incident.js": "text/javascript; charset=utf-8",
    "flightrec.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' blob: data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> str:
    return resources.files("collector.web").joinpath(name).read_text()


def add_pages(app: FastAPI, ctx: Any) -> None:
    @app.get("/", include_in_schema=False)
    def index() -> RedirectResponse:
        return RedirectResponse("/snapshots")

    @app.get("/snapshots", include_in_schema=False, response_class=HTMLResponse)
    def snapshots_page() -> HTMLResponse:
        return HTMLResponse(_asset("list.html"), headers=SECURITY_HEADERS)

    @app.get("/snapshots/{snapshot_id}", name="snapshot_page", include_in_schema=False, response_class=HTMLResponse)
    def snapshot_page(snapshot_id: int = Path(ge=1, le=2**62)) -> HTMLResponse:
        # An unknown id is a 404 page (the shell would say "not found" with a 200). The row
        # holds no secret, so the check needs no token; a database that is down still gets
        # the shell, whose API calls then say why.
        try:
            ctx.repo.get_snapshot_blobs(snapshot_id, parts=())
        except NotFound:
            body = _asset("notfound.html").replace("{{SNAPSHOT_ID}}", html.escape(str(snapshot_id)))
            return HTMLResponse(body, status_code=404, headers=SECURITY_HEADERS)
        except StorageError:
            pass
        page = _asset("snapshot.html").replace("{{SNAPSHOT_ID}}", html.escape(str(snapshot_id)))
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @app.get("/incidents/{incident_id}", name="incident_page", include_in_schema=False, response_class=HTMLResponse)
    def incident_page(incident_id: int = Path(ge=1, le=2**62)) -> HTMLResponse:
        page = _asset("incident.html").replace("{{INCIDENT_ID}}", html.escape(str(incident_id)))
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @app.get("/ui/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        media = ASSETS.get(name)
        if media is None:
            raise HTTPException(404, "no such asset")
        return Response(_asset(name), media_type=media, headers=SECURITY_HEADERS)
