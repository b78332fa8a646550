"""The API over a real database, without the rest of the sidecar: a context holding the
settings, a hub (live state) and the repository, as the service builds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collector.ingest.hub import Hub
from collector.settings import EngineConfig, Settings
from collector.storage.db import make_engine
from collector.storage.repo import Repository


@dataclass
class _Writer:
    db_up: bool | None = True


@dataclass
class _Snapshots:
    committed: int = 0


@dataclass
class ApiContext:
    settings: Settings
    hub: Hub
    repo: Repository
    loop: Any
    writer: _Writer = field(default_factory=_Writer)
    snapshots: _Snapshots = field(default_factory=_Snapshots)
    snapshot_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    manual: list[tuple[str | None, str]] = field(default_factory=list)

    def source_statuses(self) -> list[Any]:
        return []

    def alert_stats(self) -> dict[str, int]:
        return {}


class _Loop:
    """Stands in for the service's event loop: records what handlers schedule on it."""

    def __init__(self, ctx_ref: list[ApiContext]) -> None:
        self.ctx_ref = ctx_ref

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.ctx_ref[0].manual.append(tuple(args))  # type: ignore[arg-type]


def make_context(url: str, *, host_name: str = "node-a", **settings: Any) -> ApiContext:
    settings.setdefault("engines", [EngineConfig(name="decode-0", url="http://127.0.0.1:1", pair="pd-0")])
    s = Settings(database=url, host_name=host_name, **settings)
    hub = Hub(s)
    ref: list[ApiContext] = []
    ctx = ApiContext(settings=s, hub=hub, repo=Repository(make_engine(url), host=hub.host), loop=_Loop(ref))
    ref.append(ctx)
    return ctx


