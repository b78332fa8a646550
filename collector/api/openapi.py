"""The OpenAPI document's security scheme and error responses, and /docs served offline.

Swagger UI's assets (Swagger UI 5, which renders OpenAPI 3.1: the 4.x of ``swagger-ui-bundle``
did not, "does not specify a valid version field") come from the ``fastapi-offline`` package,
whose ``static/`` folder is a current Swagger UI build; only its files are used, served here (no
CDN: a sidecar on a GPU node often has no internet). Without it, /docs is a plain page listing
the operations.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse

ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or wrong bearer token", **ERROR},
    403: {"description": "no api_token configured: writes, and reads beyond loopback, are refused", **ERROR},
    413: {"description": "request body over 64 KiB", **ERROR},
    503: {"description": "the database is unavailable", **ERROR},
}
ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")


def _swagger_dir() -> Path | None:
    """The folder holding Swagger UI's bundle and stylesheet, or None when not installed."""
    try:
        import fastapi_offline
    except ImportError:
        return None
    static = Path(fastapi_offline.__file__).parent / "static"
    return static if all((static / name).is_file() for name in SWAGGER_FILES) else None


# Answered without a token: the sidecar's health, and an engine's health verdict (a probe has no
# token; it says no more than the engine's own /health would)
OPEN_PATHS = frozenset({"/healthz", "/api/v1/engines/{name}/health"})


def install_openapi(app: FastAPI) -> None:
    """Bearer security on every operation but the open ones (``OPEN_PATHS``), and the error
    responses listed."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        comps = doc.setdefault("components", {})
        comps.setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "api_token; required for writes, and for reads when bound beyond loopback",
        }
        comps.setdefault("schemas", {})["Error"] = {
            "type": "object",
            "required": ["detail"],
            "properties": {"detail": {"type": "string"}},
        }
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                if path in OPEN_PATHS:
                    op["security"] = []
                    continue
                op["security"] = [{"bearer": []}]
                responses = op.setdefault("responses", {})
                for code, body in ERROR_RESPONSES.items():
                    if code == 413 and method not in ("post", "put", "patch"):
                        continue
                    responses.setdefault(str(code), body)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def add_docs(app: FastAPI) -> None:
    """/docs from local assets (create the app with docs_url=None)."""
    assets = _swagger_dir()

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        if assets is not None:
            return get_swagger_ui_html(
                openapi_url="/openapi.json",
                title=f"{app.title} - API",
                swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                swagger_css_url="/docs/assets/swagger-ui.css",
                swagger_favicon_url="/docs/assets/favicon.png",
            )
        return HTMLResponse(_plain_docs(app.openapi()))

    @app.get("/docs/assets/{name}", include_in_schema=False)
    def docs_asset(name: str) -> FileResponse:
        path = (assets / name) if assets is not None else None
        if path is None or path.suffix not in ASSET_TYPES or "/" in name or not path.is_file():
            raise HTTPException(404, "no such asset")
        return FileResponse(path, media_type=ASSET_TYPES[path.suffix], headers={"Cache-Control": "max-age=86400"})


def _plain_docs(doc: dict[str, Any]) -> str:
    rows = []
    for path, ops in sorted(doc.get("paths", {}).items()):
        for method, op in ops.items():
            summary = html.escape(op.get("summary") or op.get("description") or "")
            rows.append(f"<tr><td>{method.upper()}</td><td><code>{html.escape(path)}</code></td><td>{summary}</td></tr>")
    return (
        "<!doctype html><meta charset=utf-8><title>API</title><h1>"
        + html.escape(doc["info"]["title"])
        + "</h1><p>The full description: <a href=/openapi.json>/openapi.json</a>.</p><table>"
        + "".join(rows)
        + "</table>"
    )
