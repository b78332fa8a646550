"""A wedge's stacks through the API: in the snapshot (``stacks``), alone (``/stacks``), in the
export; a crash snapshot has none (no key, and a 404 for ``/stacks``)."""

from __future__ import annotations

import gzip
import json
from typing import Any

from fastapi.testclient import TestClient
from test_snapshots_api import make_doc, store

from collector.api.schemas import SnapshotDocOut
from collector.model import EventKind
from tests.stacks.sample import stacks_part


def test_a_wedge_snapshot_serves_its_stacks(client: TestClient, ctx: Any) -> None:
    doc = make_doc(kind=EventKind.ENGINE_WEDGED)
    doc.stacks = stacks_part()
    sid, _ = store(ctx.repo, doc)
    whole = client.get(f"/api/v1/snapshots/{sid}").json()
    SnapshotDocOut.model_validate(whole)
    assert whole["stacks"]["processes"][0]["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"
    alone = client.get(f"/api/v1/snapshots/{sid}/stacks")
    assert alone.status_code == 200 and alone.json() == whole["stacks"]
    export = json.loads(gzip.decompress(client.get(f"/api/v1/snapshots/{sid}/export", headers={"Accept-Encoding": "identity"}).content))
    assert export["stacks"] == whole["stacks"]


def test_a_crash_snapshot_has_no_stacks(client: TestClient, ctx: Any) -> None:
    sid, _ = store(ctx.repo, make_doc())
    assert "stacks" not in client.get(f"/api/v1/snapshots/{sid}").json()
    r = client.get(f"/api/v1/snapshots/{sid}/stacks")
    assert r.status_code == 404 and "not a wedge" in r.json()["detail"]
    assert client.get("/api/v1/snapshots/999999/stacks").status_code == 404
