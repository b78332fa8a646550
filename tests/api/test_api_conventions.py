"""Conventions every endpoint keeps: one pagination name (`cursor`, the old `before_id` still
accepted), times as unix seconds or RFC 3339, a wrong token refused even on loopback, 404 for a
page of an unknown snapshot, an OpenAPI document with its security scheme and error responses,
and /docs served without internet."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from api_context import make_context
from fastapi.testclient import TestClient
from test_snapshots_api import make_doc, store

from collector.api.app import create_app
from collector.api.params import parse_time


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1757760067.5", 1757760067.5),
        ("2025-09-13T10:41:07Z", 1757760067.0),
        ("2025-09-13T12:41:07.250+02:00", 1757760067.25),
        ("2025-09-13 10:41:07z", 1757760067.0),
    ],
)
def test_times_are_unix_seconds_or_rfc3339(text: str, seconds: float) -> None:
    assert parse_time("since", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["2025-09-13T10:41:07", "yesterday", "nan", "-1", "inf", "2025-13-45T10:41:07Z", "0000-01-01T00:00:00Z"])
def test_a_time_without_offset_or_sense_is_422(client: TestClient, text: str) -> None:
    r = client.get("/api/v1/events", params={"since": text})
    # FastAPI's validation body, as the OpenAPI schema declares for 422
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "since"]
    assert "since" in r.json()["detail"][0]["msg"]


def add_events(ctx: Any, times: list[float]) -> None:
    ctx.repo.write_batch(
        [],
        [],
        [
            {
                "ts": ts,
                "kind": "xid",
                "source": "kmsg",
                "severity": "warning",
                "engine": None,
                "gpu": "0000:00:06.0",
                "xid": 43,
                "pid": None,
                "process": None,
                "message": "NVRM: Xid (PCI:0000:00:06): 43",
                "data": {},
            }
            for ts in times
        ],
        {},
    )


def test_rfc3339_filters_the_same_rows_as_seconds(client: TestClient, ctx: Any) -> None:
    t = time.time() - 100
    store(ctx.repo, make_doc(ts=t))
    new, _ = store(ctx.repo, make_doc(ts=t + 50), window=1)
    add_events(ctx, [t, t + 50])
    by_seconds = [s["id"] for s in client.get("/api/v1/snapshots", params={"since": t + 10}).json()["items"]]
    by_rfc = [s["id"] for s in client.get("/api/v1/snapshots", params={"since": rfc3339(t + 10)}).json()["items"]]
    assert by_seconds == by_rfc == [new]
    events = client.get("/api/v1/events", params={"until": rfc3339(t + 10)}).json()["items"]
    assert events and all(e["ts"] < t + 10 for e in events)


def test_events_page_with_cursor_and_the_old_before_id(client: TestClient, ctx: Any) -> None:
    add_events(ctx, [time.time() - 100 + i for i in range(5)])
    everything = [e["id"] for e in client.get("/api/v1/events", params={"limit": 1000}).json()["items"]]
    assert len(everything) >= 4
    seen, cursor = [], None
    while True:
        r = client.get("/api/v1/events", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        page = r.json()
        seen += [e["id"] for e in page["items"]]
        assert r.headers.get("x-next-cursor") == page["next_cursor"]  # one cursor, in the body and the header
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == everything  # no duplicate, no gap
    old = client.get("/api/v1/events", params={"limit": 2, "before_id": everything[1]}).json()["items"]
    new = client.get("/api/v1/events", params={"limit": 2, "cursor": str(everything[1])}).json()["items"]
    assert old == new and old[0]["id"] == everything[2]
    assert client.get("/api/v1/incidents", params={"cursor": "x!"}).status_code == 400


def test_every_list_pages_the_same_way(client: TestClient, ctx: Any) -> None:
    t = time.time() - 500
    for i in range(3):
        store(ctx.repo, make_doc(ts=t + i * 100), window=1)
    add_events(ctx, [t + i for i in range(3)])
    for path in ("/api/v1/snapshots", "/api/v1/incidents", "/api/v1/events"):
        seen, cursor = [], None
        while True:
            r = client.get(path, params={"limit": 2, **({"cursor": cursor} if cursor else {})})
            page = r.json()
            assert set(page) == {"items", "next_cursor"}, path
            assert r.headers.get("x-next-cursor") == page["next_cursor"], path
            seen += [x["id"] for x in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) >= 3, (path, seen)


def test_a_wrong_token_on_a_loopback_read_is_401(migrated_url: str) -> None:
    with TestClient(create_app(make_context(migrated_url, api_token="tok-123"))) as c:
        assert c.get("/api/v1/snapshots").status_code == 200  # no token: loopback reads are open
        assert c.get("/api/v1/snapshots", headers={"Authorization": "Bearer tok-123"}).status_code == 200
        r = c.get("/api/v1/snapshots", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    with TestClient(create_app(make_context(migrated_url))) as c:  # no api_token at all
        assert c.get("/api/v1/events", headers={"Authorization": "Bearer x"}).status_code == 401


def test_the_page_of_an_unknown_snapshot_is_404(client: TestClient, ctx: Any) -> None:
    sid, _ = store(ctx.repo, make_doc())
    assert client.get(f"/snapshots/{sid}").status_code == 200
    r = client.get(f"/snapshots/{sid + 98}")
    assert r.status_code == 404 and f"No snapshot {sid + 98}" in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'none'")


def test_openapi_has_the_bearer_scheme_and_the_error_responses(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "api_token; required for writes, and for reads when bound beyond loopback",
    }
    snapshots = doc["paths"]["/api/v1/snapshots"]
    assert snapshots["get"]["security"] == [{"bearer": []}]
    assert {"401", "403", "503"} <= set(snapshots["get"]["responses"]) and "413" not in snapshots["get"]["responses"]
    assert {"401", "403", "413", "503"} <= set(snapshots["post"]["responses"])
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    assert doc["paths"]["/api/v1/engines/{name}/health"]["get"]["security"] == []  # a probe has no token
    params = {p["name"] for p in doc["paths"]["/api/v1/events"]["get"]["parameters"]}
    assert {"cursor", "since", "until"} <= params


def test_docs_are_served_from_local_assets(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text.lower() and "//" not in page.text.split("<body>", 1)[-1].replace("://", "")
    js = client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript") and len(js.content) > 100_000
    assert client.get("/docs/assets/swagger-ui.css").status_code == 200
    version = re.search(rb'PACKAGE_VERSION:"(\d+)\.', js.content)
    assert version is not None and int(version.group(1)) >= 5  # Swagger UI 5 renders OpenAPI 3.1; 4.x did not
    assert client.get("/docs/assets/..%2Fsecret").status_code == 404


@pytest.mark.parametrize("cursor", ["\u00b2", "\u0663", "12\u00b9", "-1", "0", "9" * 20])
def test_a_cursor_that_is_not_ascii_digits_is_400(client: TestClient, cursor: str) -> None:
    # "\u00b2".isdigit() is true and int() of it raises: a 500 before (found by schemathesis)
    for path in ("/api/v1/incidents", "/api/v1/events"):
        r = client.get(path, params={"cursor": cursor})
        assert r.status_code == 400 and "cursor" in r.json()["detail"], (path, cursor, r.status_code)


def test_no_list_endpoint_answers_a_bare_array(client: TestClient) -> None:
    """Every list is ``{"items": [...], "next_cursor": ...}``, the live ones (engines, GPUs,
    detectors) included: one shape for a script to read."""
    spec = client.get("/openapi.json").json()
    bare = []
    for path, ops in spec["paths"].items():
        get = ops.get("get")
        if not get or not path.startswith("/api/v1"):
            continue
        schema = get["responses"].get("200", {}).get("content", {}).get("application/json", {}).get("schema", {})
        if schema.get("type") == "array":
            bare.append(path)
    assert bare == []
    for path in ("/api/v1/engines", "/api/v1/gpus", "/api/v1/detectors"):
        page = client.get(path).json()
        assert set(page) == {"items", "next_cursor"} and page["next_cursor"] is None and isinstance(page["items"], list), path


def test_the_page_of_an_unknown_incident_is_404(client: TestClient, ctx: Any) -> None:
    sid, _ = store(ctx.repo, make_doc())
    incident = ctx.repo.get_snapshot(sid, parts=()).incident_id
    assert client.get(f"/incidents/{incident}").status_code == 200
    r = client.get(f"/incidents/{incident + 98}")
    assert r.status_code == 404 and f"No incident {incident + 98}" in r.text and "text/html" in r.headers["content-type"]


@pytest.mark.parametrize("path", ["/snapshots/abc", "/snapshots/0", "/snapshots/-3", "/incidents/abc", "/snapshots/99999999999999999999999"])
def test_a_page_route_with_a_bad_id_answers_an_html_404(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and "text/html" in r.headers["content-type"], (path, r.status_code, r.text[:200])
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
