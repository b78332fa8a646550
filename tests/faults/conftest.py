"""The fault suites' sidecar: a fresh node per test, on SQLite (or Postgres for a test whose id
names it), its engine alive (or dead, its ring left behind, for a test whose id says so)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.sidecar_node import Node, make_node


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    db = request.getfixturevalue("pg_url") if "postgres" in request.node.name else f"sqlite:///{tmp_path / 'f.db'}"
    n = make_node(tmp_path, db, dead_engine="dead-engine" in request.node.name)
    yield n
    if n.ring is not None:
        n.ring.close()
