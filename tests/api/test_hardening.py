"""The API's answers to hostile or unusual requests: huge ids are 422, gzip;q=0 is honoured,
every response says nosniff, a blank token opens nothing."""

from __future__ import annotations

from typing import Any

import pytest
from api_context import make_context
from fastapi.testclient import TestClient
from pydantic import SecretStr
from test_snapshots_api import make_doc, store

from collector.api.accept import accepts_gzip
from collector.api.app import create_app

HUGE = [str(2**63), str(2**64 + 5), "9" * 30]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/api/v1/snapshots", "incident_id"),
        ("/api/v1/incidents", "before_id"),
        ("/api/v1/events", "before_id"),
    ],
)
def test_huge_ints_in_filters_are_422(client: TestClient, path: str, param: str, value: str) -> None:
    # on SQLite and on Postgres (the client fixture runs on both)
    r = client.get(path, params={param: value})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    ("header", "gzip"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("GZIP;q=0.5", True),
        ("*", True),
        ("x-gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0, identity", False),
        ("identity", False),
        ("", False),
        (None, False),
        ("*;q=0", False),
        ("br;q=1, *;q=0", False),
        ("gzip;q=0, *", False),
        ("gzip;q=abc", False),
        ("deflate, gzip;q=0.001", True),
        ("gzip;q=2", False),
    ],
)
def test_accept_encoding_negotiation(header: str | None, gzip: bool) -> None:
    assert accepts_gzip(header) is gzip


def test_gzip_q0_gets_identity(client: TestClient, ctx: Any) -> None:
    sid, _ = store(ctx.repo, make_doc())
    r = client.get(f"/api/v1/snapshots/{sid}", headers={"Accept-Encoding": "gzip;q=0"})
    assert r.status_code == 200 and "content-encoding" not in r.headers
    assert r.json()["engine"] == "decode-0"


@pytest.mark.parametrize(
    "path",
    [
        "/healthz",
        "/api/v1/engines",
        "/api/v1/snapshots",
        "/api/v1/events",
        "/api/v1/incidents",
        "/api/v1/snapshots/999",
        "/api/v1/nope",
        "/openapi.json",
    ],
)
def test_every_response_says_nosniff(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.headers.get("x-content-type-options") == "nosniff", (path, r.status_code)


def test_nosniff_on_errors_of_the_middleware_too(client: TestClient) -> None:
    r = client.post("/api/v1/snapshots", content=b"x" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.headers.get("x-content-type-options") == "nosniff"


@pytest.mark.parametrize("token", ["", " "])
def test_a_blank_token_opens_nothing(api_url: str, token: str) -> None:
    ctx = make_context(api_url, host="0.0.0.0")
    # bypass the settings check, as a settings object built some other way would
    ctx.settings = ctx.settings.model_copy(update={"api_token": SecretStr(token)})
    with TestClient(create_app(ctx)) as c:
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer  "}):
            assert c.get("/api/v1/snapshots", headers=headers).status_code in (401, 403)
            assert c.post("/api/v1/snapshots", json={"reason": "x"}, headers=headers).status_code in (401, 403)


def test_a_database_that_does_not_answer_is_a_503_within_the_reads_bound(migrated_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a hung database (SIGSTOPped Postgres) held each read until the watchdog cut its statement
    # and the pool connected again: 10 s in the outage run; now the read's bound, then 503
    import threading
    import time as _time

    import collector.api.app as app_module

    monkeypatch.setattr(app_module, "STORE_WAIT_S", 0.3)
    ctx = make_context(migrated_url)
    release = threading.Event()

    def hung(*_: object, **__: object) -> None:
        release.wait(10)

    for name in ("list_snapshots", "list_incidents", "list_events", "get_snapshot_blobs", "get_incident"):
        monkeypatch.setattr(ctx.repo, name, hung)
    try:
        with TestClient(create_app(ctx)) as client:
            for path in (
                "/api/v1/snapshots",
                "/api/v1/incidents",
                "/api/v1/events",
                "/api/v1/snapshots/1",
                "/api/v1/snapshots/1/export",
                "/api/v1/snapshots/1/checklist",
                "/api/v1/incidents/1",
            ):
                t0 = _time.monotonic()
                r = client.get(path)
                took = _time.monotonic() - t0
                assert r.status_code == 503 and "did not answer" in r.json()["detail"], (path, r.status_code, r.text)
                assert took < 2.0, (path, took)
            assert client.get("/healthz").status_code == 200  # the live answers go on
    finally:
        release.set()
