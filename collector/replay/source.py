"""Where a replay's snapshot comes from (an export file, the database, a sidecar's API), where
the replay's own snapshot is looked for afterwards, and the link between the two.

The link is stored in the first snapshot's summary (``replays: [...]``), which is served with
it, so that opening the original shows that it was reproduced and by which snapshot.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path
from typing import Any

import httpx

from collector.errors import FlightrecError
from collector.storage.connect import StorageError


class ReplaySourceError(FlightrecError, RuntimeError):
    """The snapshot (or the sidecar) could not be read."""


def from_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, ValueError) as exc:
        raise ReplaySourceError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or "engine" not in data:
        raise ReplaySourceError(f"{path} is not a snapshot export")
    return data


def from_db(database: str, snap_id: int, *, host: str) -> dict[str, Any]:
    from collector.storage.connect import make_engine
    from collector.storage.repo import Repository

    try:
        doc = Repository(make_engine(database), host=host).get_snapshot(snap_id, parts=("workload",))
    except StorageError as exc:
        raise ReplaySourceError(str(exc)) from exc
    out = doc.header()
    out["workload"] = doc.workload
    return out


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def from_sidecar(base: str, snap_id: int, *, token: str | None = None) -> dict[str, Any]:
    try:
        resp = httpx.get(f"{base.rstrip('/')}/api/v1/snapshots/{snap_id}", headers=_headers(token), timeout=60.0)
    except httpx.HTTPError as exc:
        raise ReplaySourceError(f"sidecar {base}: {exc}") from exc
    if resp.status_code != 200:
        raise ReplaySourceError(f"sidecar {base}: snapshot {snap_id}: HTTP {resp.status_code} {resp.text[:200]}")
    data = resp.json()
    if not isinstance(data, dict):
        raise ReplaySourceError(f"sidecar {base}: snapshot {snap_id} is not an object")
    return data


# what a death leaves: a snapshot of an anomaly or a manual one taken during the replay is not it
NOT_A_DEATH = frozenset({"anomaly", "manual"})


def pick(items: list[dict[str, Any]], *, exclude: int | None, engine: str | None, final: bool) -> dict[str, Any] | None:
    """The replay's snapshot among those stored since it started: the first of the original's
    engine (when known) whose trigger is a fault, not an anomaly or a manual one. Only when
    ``final`` (no more waiting) does any snapshot do, so an anomaly committed before the death
    is not taken for it."""
    items = [i for i in items if i.get("id") != exclude]
    if engine is not None and any(i.get("engine") == engine for i in items):
        items = [i for i in items if i.get("engine") == engine]
    faults = [i for i in items if str(i.get("trigger_kind")) not in NOT_A_DEATH]
    chosen = faults or (items if final else [])
    return min(chosen, key=lambda i: (i.get("created_at") or 0, i.get("id") or 0)) if chosen else None


async def new_snapshot_from_sidecar(
    base: str, since: float, *, wait_s: float, token: str | None = None, exclude: int | None = None, engine: str | None = None
) -> dict[str, Any] | None:
    """The replay's snapshot (``pick``) among those the sidecar stored after ``since`` (unix
    seconds), waiting up to ``wait_s`` for one to appear; None when none did."""
    deadline = time.monotonic() + wait_s
    async with httpx.AsyncClient(timeout=10.0, headers=_headers(token)) as client:
        while True:
            try:
                resp = await client.get(f"{base.rstrip('/')}/api/v1/snapshots", params={"since": since, "limit": 50})
                items = resp.json().get("items", []) if resp.status_code == 200 else []
            except (httpx.HTTPError, ValueError, AttributeError):
                items = []
            final = time.monotonic() >= deadline
            first = pick(items, exclude=exclude, engine=engine, final=final)
            if first is not None:
                first["url"] = f"{base.rstrip('/')}/snapshots/{first['id']}"
                return dict(first)
            if final:
                return None
            await asyncio.sleep(1.0)


async def new_snapshot_from_db(
    database: str, since: float, *, host: str, wait_s: float, exclude: int | None = None, engine: str | None = None
) -> dict[str, Any] | None:
    from collector.storage.connect import make_engine
    from collector.storage.repo import Repository, SnapshotFilter

    repo = Repository(make_engine(database), host=host)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            rows, _ = await asyncio.to_thread(repo.list_snapshots, SnapshotFilter(since=since), limit=50)
        except StorageError:
            rows = []
        final = time.monotonic() >= deadline
        first = pick(rows, exclude=exclude, engine=engine, final=final)
        if first is not None:
            return dict(first)
        if final:
            return None
        await asyncio.sleep(1.0)


def link_replay(database: str, original: int, replay: dict[str, Any], *, host: str) -> None:
    """Record in the original snapshot's summary, in the database, that a replay reproduced (or
    not) its fault. A sidecar serving that database may show its cached copy for a while: link
    through it instead (``link_replay_via_sidecar``) when one watches."""
    from collector.storage.connect import make_engine
    from collector.storage.repo import NotFound, Repository

    engine = make_engine(database)
    try:
        Repository(engine, host=host).add_replay(original, replay)
    except NotFound as exc:
        raise ReplaySourceError(str(exc)) from exc
    except StorageError as exc:
        raise ReplaySourceError(f"cannot link the replay to snapshot {original}: {exc}") from exc
    finally:
        engine.dispose()


def link_replay_via_sidecar(base: str, original: int, replay: dict[str, Any], *, token: str | None = None) -> None:
    """The same link through the sidecar's API, which also drops its cached copy of the original."""
    try:
        resp = httpx.post(f"{base.rstrip('/')}/api/v1/snapshots/{original}/replays", json=replay, headers=_headers(token), timeout=30.0)
    except httpx.HTTPError as exc:
        raise ReplaySourceError(f"sidecar {base}: {exc}") from exc
    if resp.status_code not in (200, 201):
        raise ReplaySourceError(f"sidecar {base}: linking to snapshot {original}: HTTP {resp.status_code} {resp.text[:200]}")
