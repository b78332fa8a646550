"""HTML pages: a snapshot list, a page per snapshot and per incident, and their static assets.

The pages are shells whose data comes from the JSON API, which enforces the token, except the
snapshot page's first sections (its summary and next steps, ``collector/api/snapshot_page.py``),
rendered on the server for a reader the API would answer, so that the fault reads at once. A
page opened as ``/snapshots/12?token=T`` keeps ``T`` in the tab's sessionStorage and sends it as
a bearer token (see flightrec.js).
A strict Content-Security-Policy allows only this origin's scripts: no inline script, no
outside resource, so a log line that looks like HTML can do nothing even if it were inserted
as markup (it is not: the pages set text only).
"""

from __future__ import annotations

import hmac
import html
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from collector.api.snapshot_page import PageFacts
from collector.api.snapshot_page import render as render_sections
from collector.storage.connect import StorageError
from collector.storage.repo import NotFound

ASSETS = {
    "flightrec.js": "text/javascript; charset=utf-8",
    "snapshot.js": "text/javascript; charset=utf-8",
    "stacks.js": "text/javascript; charset=utf-8",
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
    def snapshot_page(request: Request, snapshot_id: str, token: str | None = None) -> HTMLResponse:
        # An unknown or malformed id is a 404 page (the shell would say "not found" with a 200,
        # FastAPI a JSON 422). The existence check needs no token (the row's id is no secret);
        # the summary and next steps are rendered here only for a reader the API would answer
        # (loopback, or the token: ?token= on a link); otherwise the script fills them in.
        sid = _page_id(snapshot_id)
        if sid is None:
            return _not_found("snapshot", snapshot_id)
        try:
            doc, _ = ctx.repo.get_snapshot_blobs(sid, parts=())
        except NotFound:
            return _not_found("snapshot", snapshot_id)
        except StorageError:
            doc = None  # a database that is down: the shell, whose API calls then say why
        sections = ""
        if doc is not None and _may_read(request, token):
            sections = render_sections(_facts(ctx, doc))
        page = _asset("snapshot.html").replace("{{SNAPSHOT_ID}}", html.escape(str(sid))).replace("{{SECTIONS}}", sections)
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @app.get("/incidents/{incident_id}", name="incident_page", include_in_schema=False, response_class=HTMLResponse)
    def incident_page(incident_id: str) -> HTMLResponse:
        iid = _page_id(incident_id)
        if iid is None:
            return _not_found("incident", incident_id)
        try:
            ctx.repo.get_incident(iid)
        except NotFound:
            return _not_found("incident", incident_id)
        except StorageError:
            pass
        page = _asset("incident.html").replace("{{INCIDENT_ID}}", html.escape(str(iid)))
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    @app.get("/ui/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        media = ASSETS.get(name)
        if media is None:
            raise HTTPException(404, "no such asset")
        return Response(_asset(name), media_type=media, headers=SECURITY_HEADERS)


def _page_id(raw: str) -> int | None:
    """A page's id as the API takes it (1 to 2**62), or None."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        return None
    value = int(raw)
    return value if 1 <= value <= 2**62 else None


def _not_found(what: str, raw: str) -> HTMLResponse:
    body = _asset("notfound.html").replace("{{WHAT}}", what).replace("{{ID}}", html.escape(raw[:64]))
    return HTMLResponse(body, status_code=404, headers=SECURITY_HEADERS)


def _may_read(request: Request, token: str | None) -> bool:
    """Whether the API would answer this reader: loopback reads are open; beyond loopback the
    token, sent as a header or as the page link's ?token=."""
    ctx = request.app.state.ctx
    if ctx.settings.loopback_only:
        return True
    want = ctx.settings.api_token.get_secret_value() if ctx.settings.api_token else None
    header = request.headers.get("authorization", "")
    got = header[7:].strip() if header[:7].lower() == "bearer " else token
    return bool(want and got and hmac.compare_digest(got.encode(), want.encode()))


def _facts(ctx: Any, doc: Any) -> PageFacts:
    settings = ctx.settings
    info = ctx.view.engine(doc.engine) if doc.host == ctx.view.host else None
    url = getattr(info, "url", None) or next((str(e.url) for e in settings.engines if e.name == doc.engine), None)
    return PageFacts(
        doc=doc,
        runbook_base=settings.alerting.runbook_base,
        database=command_database(settings.database),
        engine_url=url,
    )


def command_database(url: str) -> str:
    """The sidecar's database as a command run anywhere on the node can name it: a relative
    SQLite path made absolute (four slashes), a password masked."""
    from pathlib import Path as FilePath

    from collector.redact import redact_text

    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and ":memory:" not in url:
        rest = url[len("sqlite:///") :]
        path, sep, query = rest.partition("?")
        url = "sqlite:///" + str(FilePath(path).resolve()) + sep + query
    return redact_text(url)
