"""The FastAPI application. Everything it serves comes from ingest's view (live state) or the
repository (stored snapshots, incidents, events). A handler's database work runs in a thread
(``_stored``), so a slow query never stalls the event loop, and is waited for at most
``STORE_WAIT_S``: a hung database is a 503 within that time, not a request held until the
watchdog cuts its statement and the pool has connected again (10 s in the outage run)."""

from __future__ import annotations

import asyncio
import functools
import json
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector import __version__
from collector.api import schemas
from collector.api.accept import accepts_gzip
from collector.api.auth import require_read, require_write
from collector.api.body_limit import MAX_BODY, BodyLimit
from collector.api.export_cache import ExportCache
from collector.api.headers import SecurityHeaders
from collector.api.metrics import sidecar_registry
from collector.api.openapi import add_docs, install_openapi
from collector.api.params import BeforeIdQuery, CursorQuery, TimeQuery, id_cursor, time_range
from collector.context import AppContext
from collector.model import EventKind
from collector.redact import redact
from collector.snapshot.checklist import checklist
from collector.snapshot.document import export_gzip, unpack
from collector.storage.connect import StorageError
from collector.storage.repo import BadCursor, NotFound, SnapshotFilter

__all__ = ["MAX_BODY", "create_app"]
Read = Depends(require_read)
PathId = Path(ge=1, le=2**62, description="numeric id")
# Bounded like PathId: an int past 2**63 in a filter reached the database (500 on SQLite, 503 on
# Postgres) instead of being a 422.
IdQuery = Query(ge=1, le=2**62)
Write = Depends(require_write)
# The live routes (engines, GPUs) join what is stored; a database that is slow or hung must not
# hold the live answer: past this, the answer is the live state only (the read goes on in its
# thread until the database answers or the watchdog cuts it).
STORED_WAIT_S = 2.0
# A read of stored snapshots, incidents or events: past this a 503 (above Postgres's own
# statement_timeout, 5 s, so a statement the server cancels reports its own error first).
STORE_WAIT_S = 6.0
# The reads' own threads, as many as FastAPI's thread pool gave the plain handlers they were
# (40): the loop's default executor is sized by the host (6 threads on 2 cores outside `serve`),
# and 20 clients fetching at once queued behind it (bench_snapshot_api: fetch p99 2.6 s).
READ_THREADS = 40
_readers: ThreadPoolExecutor | None = None
T = TypeVar("T")


async def _stored(fn: Callable[..., T], *args: Any, wait_s: float | None = None, **kwargs: Any) -> T:
    """``fn`` in a reader thread, waited for at most ``wait_s`` (default ``STORE_WAIT_S``); past it
    a ``StorageError`` (a 503, or the live routes' degraded answer), while the thread runs on until
    the database answers or the watchdog cuts it."""
    wait = STORE_WAIT_S if wait_s is None else wait_s
    global _readers  # noqa: PLW0603 - one pool per process, made on first use
    if _readers is None:
        _readers = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="flightrec-api")
    call = asyncio.get_running_loop().run_in_executor(_readers, functools.partial(fn, *args, **kwargs))
    try:
        return await asyncio.wait_for(call, wait)
    except TimeoutError:
        raise StorageError(f"the database did not answer within {wait:g} s") from None


def _accepts_gzip(request: Request) -> bool:
    return accepts_gzip(request.headers.get("accept-encoding"))


def _lean(summary: dict[str, Any]) -> dict[str, Any]:
    """A list row's summary without the bulky parts (the last scrape, per-request maps)."""
    out = {k: v for k, v in (summary or {}).items() if k not in ("last_scrape",)}
    reqs = out.get("requests_at_last_step")
    if isinstance(reqs, dict) and "mirror_rows" in reqs:
        out["requests_at_last_step"] = {k: v for k, v in reqs.items() if k != "mirror_rows"}
    return out


def _summary(row: dict[str, Any], request: Request) -> dict[str, Any]:
    row = dict(row)
    row["summary"] = _lean(row.get("summary") or {})
    row["url"] = str(request.url_for("snapshot_page", snapshot_id=row["id"]))
    return row


def _page(items: list[dict[str, Any]], next_cursor: str | None) -> Response:
    """Every list answers one way: ``{"items": [...], "next_cursor": ...}``, the cursor also in
    an ``X-Next-Cursor`` header (absent on the last page)."""
    out = _json({"items": items, "next_cursor": next_cursor})
    if next_cursor is not None:
        out.headers["X-Next-Cursor"] = next_cursor
    return out


def _id_cursor(rows: list[dict[str, Any]], limit: int) -> str | None:
    """A full page may have a next one: its cursor is the last row's id."""
    return str(rows[-1]["id"]) if len(rows) == limit and rows else None


def _json(obj: Any) -> Response:
    # Already shaped as the response model says: serialised directly, not re-validated.
    return Response(json.dumps(obj, separators=(",", ":"), default=str), media_type="application/json")


def one_page(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A live list (engines, GPUs, detectors: one node's, never long) in the shape every list
    has: one page, no cursor."""
    return {"items": items, "next_cursor": None}


def create_app(ctx: AppContext) -> FastAPI:
    app = FastAPI(
        title="vLLM Flight Recorder",
        version=__version__,
        description="Crash snapshots of vLLM engines: the last steps before a fault, per request, joined with the GPU's state and the fault.",
        docs_url=None,  # served from local assets: collector/api/openapi.py
        redoc_url=None,
    )
    install_openapi(app)
    add_docs(app)
    app.state.ctx = ctx
    app.add_middleware(BodyLimit, max_body=MAX_BODY)
    app.add_middleware(SecurityHeaders)
    registry = sidecar_registry(ctx)

    @app.exception_handler(StorageError)
    async def _storage_error(_: Request, exc: StorageError) -> JSONResponse:
        if isinstance(exc, NotFound):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        return JSONResponse({"detail": f"database unavailable: {exc}"}, status_code=503)

    @app.exception_handler(BadCursor)
    async def _bad_cursor(_: Request, exc: BadCursor) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    # Handlers that read ingest's live state are async: they run on the loop that writes it,
    # never in a worker thread beside it. Database reads go to a thread.
    @app.get("/healthz", response_model=schemas.Health)
    async def healthz() -> dict[str, Any]:
        return ctx.health()

    @app.get(
        "/api/v1/engines/{name:path}/health",
        response_model=schemas.EngineHealth,
        responses={
            503: {"model": schemas.EngineHealth, "description": "wedged, down or its GPU faulted"},
            404: {"description": "no such engine on this sidecar"},
        },
    )
    async def engine_health(name: Annotated[str, Path(max_length=128)]) -> JSONResponse:
        """One engine's health verdict, for a Kubernetes probe or a load balancer: 200 while it is
        ok, idle, asleep, paused or starting, 503 while it is wedged, down or its GPU faulted. No token,
        like /healthz: it says no more than the engine's own /health would."""
        verdict = ctx.engine_health(name)
        if verdict is None:
            raise HTTPException(404, f"no engine named {name!r} on this sidecar")
        healthy = verdict.pop("healthy")
        return JSONResponse(verdict, status_code=200 if healthy else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(_: None = Read) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/detectors", response_model=schemas.DetectorList)
    async def detectors(_: None = Read) -> dict[str, Any]:
        return one_page(ctx.detector_states())

    @app.get("/api/v1/engines", response_model=schemas.EngineList)
    async def engines(_: None = Read) -> dict[str, Any]:
        out = ctx.engines_live()
        try:
            stored = await _stored(ctx.repo.list_engines, wait_s=STORED_WAIT_S)
        except StorageError:
            stored = []  # degraded: live state only
        by_key = {(e["host"], e["name"]): e for e in stored}
        for row in out:
            prev = by_key.pop((row["host"], row["name"]), {})
            row["vllm_version"] = row["vllm_version"] or prev.get("vllm_version")
            row["fingerprint"] = row["fingerprint"] or prev.get("fingerprint")
        for row in by_key.values():  # engines other sidecars (or earlier runs) stored
            out.append({k: row.get(k) for k in ("name", "host", "url", "pair", "last_seen", "vllm_version", "fingerprint")})
        for row in out:
            row["fingerprint"] = redact(row.get("fingerprint")) if row.get("fingerprint") else row.get("fingerprint")
        return one_page(out)

    @app.get("/api/v1/gpus", response_model=schemas.GpuList)
    async def gpus(_: None = Read) -> dict[str, Any]:
        out = []
        for gpu, s in sorted(ctx.view.gpus().items()):
            out.append({"gpu": gpu, "host": ctx.view.host, "index": s.index, "bus_id": s.bus_id, "name": s.name, "last_sample": s.to_dict()})
        live = {g["gpu"] for g in out}
        try:
            stored_gpus = await _stored(ctx.repo.list_gpus, wait_s=STORED_WAIT_S)
        except StorageError:
            stored_gpus = []
        for row in stored_gpus:
            if row["gpu"] not in live or row["host"] != ctx.view.host:
                out.append({k: row.get(k) for k in ("gpu", "host", "index", "bus_id", "name")})
        return one_page(out)

    @app.get("/api/v1/snapshots", response_model=schemas.SnapshotList)
    async def list_snapshots(
        request: Request,
        engine: Annotated[str | None, Query(max_length=128)] = None,
        host: Annotated[str | None, Query(max_length=255)] = None,
        trigger: Annotated[EventKind | None, Query(description="trigger kind, e.g. xid")] = None,
        incident_id: Annotated[int | None, IdQuery] = None,
        since: TimeQuery = None,
        until: TimeQuery = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: CursorQuery = None,
        _: None = Read,
    ) -> Response:
        lo, hi = time_range(since, until)
        rows, nxt = await _stored(
            ctx.repo.list_snapshots,
            SnapshotFilter(engine=engine, host=host, trigger=trigger.value if trigger else None, incident_id=incident_id, since=lo, until=hi),
            limit=limit,
            cursor=cursor,
        )
        return _page([_summary(r, request) for r in rows], nxt)

    @app.get(
        "/api/v1/snapshots/{snapshot_id}",
        response_model=schemas.SnapshotDocOut,
        responses={
            200: {"description": "the snapshot (export schema flightrec.snapshot/v1); gzip-encoded when the client accepts it"},
            404: {"description": "no such snapshot"},
        },
    )
    async def get_snapshot(snapshot_id: Annotated[int, PathId], request: Request, _: None = Read) -> Response:
        body = await _body(snapshot_id)
        # The stored parts are spliced into one gzip stream (no decode, no re-encode): a
        # 4096x64 snapshot is 262k request rows, which would cost seconds to re-serialise.
        if _accepts_gzip(request):
            return Response(body, media_type="application/json", headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
        plain = await asyncio.to_thread(zlib.decompress, body, 31)
        return Response(plain, media_type="application/json", headers={"Vary": "Accept-Encoding"})

    @app.get(
        "/api/v1/snapshots/{snapshot_id}/export",
        response_class=Response,
        responses={
            200: {"content": {"application/gzip": {}}, "description": "one gzip JSON file, schema flightrec.snapshot/v1"},
            404: {"description": "no such snapshot"},
        },
    )
    async def export_snapshot(snapshot_id: Annotated[int, PathId], _: None = Read) -> Response:
        return Response(
            await _body(snapshot_id),
            media_type="application/gzip",
            headers={"Content-Disposition": f'attachment; filename="flightrec-snapshot-{snapshot_id}.json.gz"'},
        )

    @app.get(
        "/api/v1/snapshots/{snapshot_id}/stacks",
        responses={
            200: {"description": "the stacks part (schema flightrec.stacks/v1): each engine process, its threads, its blocking frame"},
            404: {"description": "no such snapshot, or one whose trigger was not a wedge (no stacks were read)"},
        },
    )
    async def snapshot_stacks(snapshot_id: Annotated[int, PathId], _: None = Read) -> dict[str, Any]:
        """A wedge's stacks alone: ``processes[].blocking.frame`` is each process's blocking frame
        (``{"function", "file", "line"}``), ``status`` says whether they were read (``reading``
        until the snapshot's amendment stores them)."""
        _doc, blobs = await _stored(ctx.repo.get_snapshot_blobs, snapshot_id, parts=("stacks",))
        if "stacks" not in blobs:
            raise HTTPException(404, f"snapshot {snapshot_id} has no stacks: its trigger was not a wedge")
        value = unpack(blobs["stacks"])
        if not isinstance(value, dict):
            raise StorageError(f"snapshot {snapshot_id} part stacks is unreadable")
        return value

    @app.get("/api/v1/snapshots/{snapshot_id}/checklist", response_model=schemas.Checklist)
    async def snapshot_checklist(snapshot_id: Annotated[int, PathId], _: None = Read) -> dict[str, Any]:
        doc, blobs = await _stored(ctx.repo.get_snapshot_blobs, snapshot_id, parts=("peers", "events"))
        peers = unpack(blobs["peers"]) if "peers" in blobs else []
        events = unpack(blobs["events"]) if "events" in blobs else []
        return {
            "snapshot_id": snapshot_id,
            "engine": doc.engine,
            "host": doc.host,
            "peers": [p.get("engine") for p in peers],
            "items": checklist(doc.header(), peers, events),
        }

    @app.get("/api/v1/snapshots/{snapshot_id}/before", response_model=schemas.StepsBefore, responses={404: {"description": "no such snapshot"}})
    async def snapshot_before(
        snapshot_id: Annotated[int, PathId],
        minutes: Annotated[float, Query(gt=0, le=120, description="how far back from the fault")] = 10.0,
        _: None = Read,
    ) -> dict[str, Any]:
        """The engine's stored steps in the minutes before the fault, binned (at most 600
        points): the ramp that led to it, beside the snapshot's own last steps. Empty where
        the steps were not stored (retention, another node's sidecar on SQLite)."""
        doc, _parts = await _stored(ctx.repo.get_snapshot_blobs, snapshot_id, parts=())
        bin_s = max(1.0, minutes * 60.0 / 600.0)
        since, until = doc.fault_ts - minutes * 60.0, doc.fault_ts + bin_s
        rows = await _stored(ctx.repo.binned_steps, host=doc.host, engine=doc.engine, since=since, until=until, bin_s=bin_s)
        keys = ("t", "steps", "running", "waiting", "kv_cache_usage", "prompt_tokens", "generation_tokens", "preemptions")
        return {
            "snapshot_id": snapshot_id,
            "engine": doc.engine,
            "fault_ts": doc.fault_ts,
            "since": since,
            "bin_s": bin_s,
            "columns": {k: [r[k] for r in rows] for k in keys},
        }

    cache = ExportCache()
    app.state.export_cache = cache

    building: dict[int, asyncio.Future[bytes]] = {}

    async def _body(snapshot_id: int) -> bytes:
        """A settled snapshot from the export cache, on the loop; any other read in a thread,
        one at a time per snapshot: the first read of a snapshot builds its request columns
        (hundreds of ms at 4,096 x 64), and 20 clients asking for a snapshot nobody had read
        yet each built it, the last answered after seconds (bench_snapshot_api: fetch p99
        4.8 s); now they wait for the one build and share it."""
        cached = cache.get(snapshot_id)
        if cached is not None:
            return cached
        fut = building.get(snapshot_id)
        if fut is None:
            fut = asyncio.ensure_future(_stored(_export, snapshot_id))
            building[snapshot_id] = fut
            fut.add_done_callback(lambda _: building.pop(snapshot_id, None))
        return await asyncio.shield(fut)

    def _export(snapshot_id: int) -> bytes:
        doc, blobs = ctx.repo.get_snapshot_blobs(snapshot_id)
        header = doc.header()
        try:
            body = export_gzip(header, blobs)
        except (OSError, zlib.error, ValueError) as exc:
            raise StorageError(f"snapshot {snapshot_id} is unreadable: {exc}") from exc
        if cache.settled(header):
            cache.put(snapshot_id, body)
        return body

    @app.post(
        "/api/v1/snapshots",
        status_code=201,
        response_model=schemas.ManualSnapshotOut,
        responses={202: {"description": "accepted, not committed yet (database down): ids follow"}},
    )
    async def manual_snapshot(body: schemas.ManualSnapshotIn, response: Response, _: None = Write) -> dict[str, Any]:
        if body.engine is not None and ctx.view.engine(body.engine) is None:
            raise HTTPException(404, f"no engine named {body.engine!r}")
        if body.engine is None and not ctx.view.engine_names():
            raise HTTPException(409, "no engines are watched")
        taken = await ctx.manual_snapshot(body.engine, body.reason)
        ids = [t["id"] for t in taken if t["id"] is not None]
        if ids and len(ids) == len(taken):
            response.headers["Location"] = f"/api/v1/snapshots/{ids[0]}"
        else:
            response.status_code = 202
        return {
            "engines": [t["engine"] for t in taken],
            "status": "accepted" if response.status_code == 202 else "committed",
            "snapshots": taken,
            "ids": ids,
        }

    @app.post("/api/v1/snapshots/{snapshot_id}/replays", status_code=201, responses={404: {"description": "no such snapshot"}})
    def link_replay(snapshot_id: Annotated[int, PathId], body: schemas.ReplayLinkIn, _: None = Write) -> dict[str, Any]:
        """Link a replay (``flightrec replay --sidecar``) from the snapshot it replayed; the
        snapshot's page and export show it at once."""
        replays = ctx.repo.add_replay(snapshot_id, body.model_dump())
        cache.drop(snapshot_id)
        return {"snapshot_id": snapshot_id, "replays": replays}

    @app.get("/api/v1/incidents", response_model=schemas.IncidentList)
    async def incidents(
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: CursorQuery = None,
        before_id: BeforeIdQuery = None,
        _: None = Read,
    ) -> Response:
        rows = await _stored(ctx.repo.list_incidents, limit=limit, before_id=id_cursor(cursor, before_id))
        return _page(rows, _id_cursor(rows, limit))

    @app.get("/api/v1/incidents/{incident_id}", response_model=schemas.IncidentOut)
    async def incident(incident_id: Annotated[int, PathId], request: Request, _: None = Read) -> dict[str, Any]:
        out = await _stored(ctx.repo.get_incident, incident_id)
        out["snapshots"] = [_summary(r, request) for r in out["snapshots"]]
        return out

    @app.get("/api/v1/events", response_model=schemas.EventList)
    async def events(
        kind: Annotated[EventKind | None, Query()] = None,
        engine: Annotated[str | None, Query(max_length=128)] = None,
        since: TimeQuery = None,
        until: TimeQuery = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: CursorQuery = None,
        before_id: BeforeIdQuery = None,
        _: None = Read,
    ) -> Response:
        lo, hi = time_range(since, until)
        rows = await _stored(
            ctx.repo.list_events,
            kind=kind.value if kind else None,
            engine=engine,
            since=lo,
            until=hi,
            limit=limit,
            before_id=id_cursor(cursor, before_id),
        )
        return _page(rows, _id_cursor(rows, limit))

    @app.get("/api/v1/incidents/{incident_id}/view", response_model=schemas.IncidentView, responses={404: {"description": "no such incident"}})
    async def incident_whole(incident_id: Annotated[int, PathId], request: Request, _: None = Read) -> Response:
        """The incident page's data: engines and hosts, one timeline of every witness, snapshots, replays, alerts."""
        from collector.api.incidents import incident_view

        view = await _stored(incident_view, ctx.repo, incident_id, page_url=lambda i: str(request.url_for("snapshot_page", snapshot_id=i)))
        return _json(view)

    from collector.api.pages import add_pages

    add_pages(app, ctx)
    from collector.api.fleet import add_fleet

    add_fleet(app, ctx)  # the fleet view: crashes grouped by signature across hosts and GPUs
    return app
