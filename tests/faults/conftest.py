"""The fault suites' sidecar: a fresh node per test, on SQLite (or Postgres for a test whose id
names it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.sidecar_node import Node, make_node


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    db = request.getfixturevalue("pg_url") if "postgres" in request.node.name else f"sqlite:///{tmp_path / 'f.db'}"
    n = make_node(tmp_path, db)
    yield n
    n.ring.close()
