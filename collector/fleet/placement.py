"""What goes where: one setting, ``database``, names a node-local store, a shared store, or one
store for everything.

    database: sqlite:///flightrec.db             # one store holds everything (a node, or a few
                                                 # nodes writing to one Postgres)
    database:
      local: sqlite:///var/lib/flightrec/node.db # per-step series (100 steps/s per engine),
                                                 # GPU samples, scrapes: bounded retention
      shared: postgresql+psycopg://fr@db/fleet   # snapshots, incidents, events, engines, GPUs,
                                                 # coarse series (one row per engine and GPU
                                                 # per 10 s)

Either side of the mapping can be absent: no ``local`` keeps per-step series only in the rings
(and in every snapshot); no ``shared`` is the one-store form. The split exists because per-step
rows do not scale past a few nodes (800 rows/s per 8-GPU node is 800,000 rows/s at 1,000
nodes), while what a fleet asks about (which nodes, which GPUs, the same crash) is in the
snapshots, events and a coarse series: docs/fleet.md has the figures.

The mapping form is validated here and stored on the settings as the primary ``database`` (the
shared one when there is one: every reader of snapshots, incidents and events uses it) and
``database_local`` with ``database_split``; ``placement`` turns them back into roles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

SPLIT_KEYS = frozenset({"local", "shared"})


class _HasDatabases(Protocol):
    database: str
    database_local: str | None
    database_split: bool


@dataclass(frozen=True)
class Placement:
    """The stores' roles. ``primary`` takes snapshots, incidents, events, engines and GPUs;
    ``series`` takes the per-step series (None: kept in the rings only); ``shared`` is set when
    a shared store takes the coarse series and the node's rows go to it through the outbox."""

    local: str | None
    shared: str | None

    @property
    def primary(self) -> str:
        url = self.shared or self.local
        assert url is not None  # the settings refuse a mapping with neither
        return url

    @property
    def series(self) -> str | None:
        return self.local

    @property
    def split(self) -> bool:
        return self.shared is not None


def placement(settings: _HasDatabases) -> Placement:
    if settings.database_split:
        return Placement(local=settings.database_local, shared=settings.database)
    return Placement(local=settings.database, shared=None)


def unfold(values: Any) -> Any:
    """The settings' raw input with a ``database`` mapping (or its JSON, from the environment)
    turned into ``database``/``database_local``/``database_split``. Raises ValueError naming the
    problem; anything else is left for the field validators."""
    if not isinstance(values, dict):
        return values
    db = values.get("database")
    if isinstance(db, str) and db.lstrip().startswith("{"):
        try:
            db = json.loads(db)
        except json.JSONDecodeError as exc:
            raise ValueError(f"database: not a URL and not a JSON mapping: {exc}") from None
    if not isinstance(db, dict):
        return values
    unknown = set(db) - SPLIT_KEYS
    if unknown:
        raise ValueError(f"database: unknown key(s) {sorted(unknown)}: the mapping takes local and shared")
    local, shared = db.get("local"), db.get("shared")
    for key, url in (("local", local), ("shared", shared)):
        if url is not None and not isinstance(url, str):
            raise ValueError(f"database.{key}: must be a database URL")
    if local is None and shared is None:
        raise ValueError("database: the mapping needs local, shared or both")
    out = dict(values)
    if shared is None:  # a local store only: the one-store form
        out["database"] = local
        out.pop("database_local", None)
        out["database_split"] = False
        return out
    out["database"] = shared
    out["database_local"] = local
    out["database_split"] = True
    return out
