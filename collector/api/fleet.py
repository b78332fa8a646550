"""The fleet view's routes: crashes grouped by signature across hosts and GPUs, incidents across
nodes, the filters' values, and the page that shows them (``/fleet``). Served by every sidecar
(over its own store) and by ``flightrec serve --fleet`` (over the shared store, no sources):
``collector/fleet/queries.py`` holds the reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from collector.api.auth import require_read
from collector.api.pages import SECURITY_HEADERS
from collector.api.params import TimeQuery, time_range
from collector.fleet.queries import FleetFilter, crash_groups, facets, fleet_incidents
from collector.storage.connect import StorageError

Read = Depends(require_read)
WAIT_S = 6.0  # as the other stored reads (collector/api/app.py STORE_WAIT_S)
T = TypeVar("T")
FAULT_CLASSES = ("hardware", "software", "unknown")


async def _read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), WAIT_S)
    except TimeoutError:
        raise StorageError(f"the database did not answer within {WAIT_S:g} s") from None


def _filter(
    host: str | None,
    engine: str | None,
    model: str | None,
    vllm_version: str | None,
    xid: int | None,
    fault_class: str | None,
    since: str | None,
    until: str | None,
) -> FleetFilter:
    if fault_class is not None and fault_class not in FAULT_CLASSES:
        raise HTTPException(400, f"fault_class must be one of {', '.join(FAULT_CLASSES)}")
    lo, hi = time_range(since, until)
    return FleetFilter(host=host, engine=engine, model=model, vllm_version=vllm_version, xid=xid, fault_class=fault_class, since=lo, until=hi)


HostQ = Annotated[str | None, Query(max_length=255)]
EngineQ = Annotated[str | None, Query(max_length=128)]
ModelQ = Annotated[str | None, Query(max_length=255)]
VersionQ = Annotated[str | None, Query(max_length=64)]
XidQ = Annotated[int | None, Query(ge=0, le=100_000)]
ClassQ = Annotated[str | None, Query(max_length=16, description="hardware | software | unknown")]
LimitQ = Annotated[int, Query(ge=1, le=500)]


def add_fleet(app: FastAPI, ctx: Any) -> None:
    def db() -> Any:
        return ctx.repo.db

    @app.get("/api/v1/fleet/crashes", tags=["fleet"])
    async def crashes(
        host: HostQ = None,
        engine: EngineQ = None,
        model: ModelQ = None,
        vllm_version: VersionQ = None,
        xid: XidQ = None,
        fault_class: ClassQ = None,
        since: TimeQuery = None,
        until: TimeQuery = None,
        limit: LimitQ = 50,
        _: None = Read,
    ) -> dict[str, Any]:
        """Snapshots grouped by crash signature, the group seen last first: how often (one
        occurrence per incident), on which hosts and GPUs, and the pattern (follows_gpu: a
        hardware suspect; recurs_across_gpus: a software one)."""
        flt = _filter(host, engine, model, vllm_version, xid, fault_class, since, until)
        # the shape of every list; the newest ``limit`` groups, no cursor
        return {"items": await _read(crash_groups, db(), flt, limit=limit), "next_cursor": None}

    @app.get("/api/v1/fleet/incidents", tags=["fleet"])
    async def incidents(
        host: HostQ = None,
        engine: EngineQ = None,
        model: ModelQ = None,
        vllm_version: VersionQ = None,
        xid: XidQ = None,
        fault_class: ClassQ = None,
        since: TimeQuery = None,
        until: TimeQuery = None,
        limit: LimitQ = 50,
        _: None = Read,
    ) -> dict[str, Any]:
        """Incidents across nodes with a snapshot that passes the filters, newest first."""
        flt = _filter(host, engine, model, vllm_version, xid, fault_class, since, until)
        return {"items": await _read(fleet_incidents, db(), flt, limit=limit), "next_cursor": None}

    @app.get("/api/v1/fleet/facets", tags=["fleet"])
    async def fleet_facets(_: None = Read) -> dict[str, list[Any]]:
        """The values each filter can take in the stored snapshots."""
        return await _read(facets, db())

    @app.get("/fleet", include_in_schema=False, response_class=HTMLResponse)
    def fleet_page() -> HTMLResponse:
        return HTMLResponse(_asset("fleet.html"), headers=SECURITY_HEADERS)

    @app.get("/fleet/ui/fleet.js", include_in_schema=False)
    def fleet_js() -> Response:
        return Response(_asset("fleet.js"), media_type="text/javascript; charset=utf-8", headers=SECURITY_HEADERS)


def _asset(name: str) -> str:
    return resources.files("collector.web").joinpath(name).read_text()
