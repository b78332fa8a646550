from __future__ import annotations

import pytest

from collector.api.export_cache import ExportCache


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_only_settled_snapshots_are_cached_and_entries_expire() -> None:
    clock = Clock()
    cache = ExportCache(ttl=60, settled_after=30, clock=clock)
    fresh = {"created_at": 990.0, "summary": {}}
    assert not cache.settled(fresh)  # may still be amended with late evidence
    assert cache.settled({"created_at": 990.0, "summary": {"amended_at": 995.0}})
    assert cache.settled({"created_at": 900.0, "summary": {}})
    cache.put(1, b"x" * 10)
    assert cache.get(1) == b"x" * 10
    clock.t += 61
    assert cache.get(1) is None  # expired: a snapshot removed by retention does not linger


def test_the_cache_is_bounded_by_bytes_least_recently_used_first() -> None:
    cache = ExportCache(max_bytes=100)
    cache.put(1, b"a" * 20)
    cache.put(2, b"b" * 20)
    cache.put(3, b"c" * 20)
    cache.put(4, b"d" * 20)
    assert cache.get(1) is not None  # 1 is now the most recently used
    cache.put(5, b"e" * 25)  # one over: the least recently used (2) goes
    assert cache.get(2) is None and cache.get(1) is not None and cache.get(5) is not None
    cache.put(6, b"f" * 26)  # over a quarter of the budget: never cached
    assert cache.get(6) is None


def test_clients_asking_at_once_for_a_snapshot_nobody_read_share_one_build(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 clients opening a fresh snapshot each built its export: the last answered after
    # seconds (bench_snapshot_api: fetch p99 4.8 s); now one build, shared
    import asyncio
    import threading
    import time as _time

    import httpx
    from api_context import make_context
    from test_snapshots_api import make_doc, store

    from collector.api.app import create_app

    ctx = make_context(api_url)
    sid, _ = store(ctx.repo, make_doc())
    real = ctx.repo.get_snapshot_blobs
    calls: list[int] = []
    lock = threading.Lock()

    def counted(*a: object, **kw: object) -> object:
        with lock:
            calls.append(1)
        _time.sleep(0.3)  # a build long enough for every client to ask meanwhile
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ctx.repo, "get_snapshot_blobs", counted)
    app = create_app(ctx)

    async def fetch_all() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            rs = await asyncio.gather(*(c.get(f"/api/v1/snapshots/{sid}") for _ in range(10)))
        return [r.status_code for r in rs]

    assert asyncio.run(fetch_all()) == [200] * 10
    assert len(calls) == 1
