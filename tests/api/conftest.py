"""Fixtures of the API tests: a migrated database (SQLite, and Postgres when marked) and a
TestClient of the app over it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from api_context import ApiContext, make_context
from fastapi.testclient import TestClient

from collector.api.app import create_app


@pytest.fixture
def api_url(migrated_url: str) -> str:
    return migrated_url


@pytest.fixture
def ctx(api_url: str) -> ApiContext:
    return make_context(api_url)


@pytest.fixture
def client(ctx: ApiContext) -> Iterator[TestClient]:
    with TestClient(create_app(ctx)) as c:
        yield c


def run(coro: Any) -> Any:
    return asyncio.run(coro)
