"""schemathesis against /openapi.json: requests generated from the schema (valid and invalid
parameters), sent with the token and without it, over a database holding a snapshot. No answer
is a 5xx, and every answer the schema describes matches it.

The app is bound beyond loopback with a token, so reads without the token are refused (401/403,
which the schema does not list: status-code conformance is not checked, the rest is).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import schemathesis  # the test extra
from api_context import make_context
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from pydantic import SecretStr
from schemathesis import GenerationMode, checks
from test_snapshots_api import make_doc, store

from collector.api.app import create_app

TOKEN = "schemathesis-t0ken"
OPEN = {"/healthz", "/api/v1/engines/{name}/health"}  # a probe's: no token
# examples per operation and mode; RELIABILITY.md records a run with FLIGHTREC_SCHEMATHESIS_EXAMPLES=300
EXAMPLES = int(os.environ.get("FLIGHTREC_SCHEMATHESIS_EXAMPLES", "40"))
CHECKS = [checks.not_a_server_error, checks.response_schema_conformance, checks.content_type_conformance]


def _schema(tmp_path: Any) -> Any:
    from collector.storage.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'flightrec.db'}"
    upgrade(url)
    ctx = make_context(url, host="0.0.0.0", api_token=SecretStr(TOKEN))
    store(ctx.repo, make_doc())
    store(ctx.repo, make_doc("prefill-0", pair="pd-0"))
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(ctx))


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _schema(tmp_path_factory.mktemp("schemathesis"))


def _operations(api_schema: Any) -> list[Any]:
    ops = [result.ok() for result in api_schema.get_all_operations()]
    assert len(ops) >= 8  # every route of /openapi.json, not an empty schema
    return ops


def _run(op: Any, headers: dict[str, str], examples: int, mode: str = "positive") -> list[tuple[str, int]]:
    """Send ``examples`` generated requests to one operation; return (path, status) of each.
    schemathesis' pytest plugin is not used: it does not load under this pytest."""
    seen: list[tuple[str, int]] = []

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=op.as_strategy(GenerationMode(mode)))
    def check(case: Any) -> None:
        response = case.call_and_validate(headers=headers, checks=CHECKS)
        seen.append((op.path, response.status_code))

    try:
        check()
    except Unsatisfiable:
        if mode != "negative":
            raise  # an operation without parameters has no request that breaks its schema
    return seen


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_api_with_the_token(api_schema: Any, mode: str) -> None:
    # positive: requests the schema allows; negative: requests that break it (wrong types, out of
    # range, missing fields), which must be 4xx and still match the schema's error shape
    auth = {"Authorization": f"Bearer {TOKEN}"}
    statuses = [s for op in _operations(api_schema) for s in _run(op, auth, EXAMPLES, mode)]
    print(f"schemathesis {mode} with token: {len(statuses)} requests, statuses {sorted(Counter(c for _, c in statuses).items())}")
    if mode == "positive":
        assert any(code == 200 for _, code in statuses)  # real answers, not only refusals
    else:
        assert any(code == 422 for _, code in statuses)


def test_api_without_the_token(api_schema: Any) -> None:
    seen = [s for op in _operations(api_schema) for s in _run(op, {}, EXAMPLES // 4)]
    print(f"schemathesis without token: {len(seen)} requests, statuses {sorted(Counter(c for _, c in seen).items())}")
    for path, code in seen:
        # refused, except what is open to all
        assert code in (401, 403, 405, 422) or path in OPEN, (path, code)
