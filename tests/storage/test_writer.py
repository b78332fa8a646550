from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from collector.ingest.hub import Hub, hub_for
from collector.model import HALF_REQUESTS, HALF_STATS, Event, EventKind, StepRecord
from collector.settings import EngineConfig, Settings
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.models import EngineStepChunkRow
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter
from tests.request_columns import Row, with_rows


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _setup(url: str, **kw: object) -> tuple[Hub, Repository, BatchWriter, Clock]:
    clock = Clock()
    settings = Settings(engines=[EngineConfig(name="decode-0", url="http://d")], host_name="node-a")
    repo = Repository(make_engine(url), host="node-a")
    writer = BatchWriter(repo, interval=0.05, clock=clock, **kw)  # type: ignore[arg-type]
    return hub_for(settings, rows=writer), repo, writer, clock


def _count(repo: Repository) -> int:
    with repo.db.connect() as conn:
        return int(conn.execute(select(func.coalesce(func.sum(EngineStepChunkRow.steps), 0))).scalar_one())


def test_rows_held_while_the_database_is_down_are_written_when_it_is_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    hub, repo, writer, clock = _setup(url)
    now = time.time()

    async def scenario() -> None:
        for i in range(300):
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.001, step=i, running=1, halves=HALF_STATS))
        hub.emit(Event(kind=EventKind.LOG, ts=now, source="log", message="kept", engine="decode-0"))
        clock.t += 3.0  # past the writer's 2 s hold
        await writer.flush()  # no tables yet: the write fails
        assert writer.db_up is False and writer.pending_rows == 301
        await asyncio.to_thread(upgrade, url)
        for i in range(300, 310):
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.001, step=i, running=1, halves=HALF_STATS))
        clock.t += 3.0  # past the writer's 2 s hold
        await writer.flush()
        assert writer.db_up is True

    asyncio.run(scenario())
    assert [s["step"] for s in repo.recent_steps("decode-0", since=0)] == list(range(310))
    assert [e["message"] for e in repo.list_events()] == ["kept"]
    assert repo.list_events()[0]["uid"]  # every event has its ingest id


def test_a_steps_two_halves_in_different_flushes_are_one_row_with_both(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    upgrade(url)
    hub, repo, writer, clock = _setup(url, hold_s=1.0)
    rows = [Row(request_id="a", prompt_len=10, computed_tokens=5, mirror_rows=7)]

    async def scenario() -> None:
        hub.emit(with_rows(StepRecord(engine="decode-0", ts=1.0, step=1), rows))  # the scheduler's half
        await writer.flush()  # within hold_s: nothing written yet
        assert _count(repo) == 0
        clock.t += 0.3
        hub.emit(
            StepRecord(
                engine="decode-0",
                ts=1.001,
                step=1,
                running=1,
                waiting=0,
                kv_cache_usage=0.032,
                preemptions=0,
                prompt_tokens=0,
                generation_tokens=1,
                halves=HALF_STATS,
            )
        )
        clock.t += 1.0
        await writer.flush()

    asyncio.run(scenario())
    [row] = repo.recent_steps("decode-0", since=0)
    assert (row["kv_cache_usage"], row["mirror_rows"], row["running"]) == (0.032, 7, 1)


def test_a_step_whose_stats_half_never_came_is_stored_with_nulls_not_zeros(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    upgrade(url)
    hub, repo, writer, clock = _setup(url, hold_s=0.0)
    rows = [Row(request_id="a", prompt_len=10, computed_tokens=5)]
    hub.emit(with_rows(StepRecord(engine="decode-0", ts=1.0, step=1, halves=HALF_REQUESTS), rows))
    asyncio.run(writer.flush())
    [row] = repo.recent_steps("decode-0", since=0)
    assert row["running"] == 1  # counted from the request block
    assert row["kv_cache_usage"] is None and row["waiting"] is None and row["preemptions"] is None


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_reading_a_ring_again_after_a_restart_adds_no_duplicate_rows(db: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}" if db == "sqlite" else request.getfixturevalue("pg_url")
    upgrade(url)
    for _ in range(2):  # two sidecar runs over the same surviving ring
        hub, repo, writer, _ = _setup(url, hold_s=0.0)
        for i in range(50):
            hub.emit(StepRecord(engine="decode-0", ts=float(i), step=i, running=1, run=4242, halves=HALF_STATS))
        asyncio.run(writer.flush())
    assert _count(repo) == 50
    # a new run of the engine (another API-server pid) starts its step numbers again: kept
    hub.emit(StepRecord(engine="decode-0", ts=99.0, step=1, running=1, run=5151, halves=HALF_STATS))
    asyncio.run(writer.flush())
    assert _count(repo) == 51


def test_the_queue_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    hub, _, writer, _ = _setup(f"sqlite:///{tmp_path / 'never.db'}", max_pending=10, hold_s=0.0)
    for i in range(25):
        hub.emit(StepRecord(engine="decode-0", ts=float(i), step=i, running=1, halves=HALF_STATS))
    asyncio.run(writer.flush())  # no tables: the steps ingest handed over are held, within the bound
    assert writer.db_up is False
    assert writer.pending_rows == 10 and writer.dropped == 15


def test_a_row_the_database_refuses_is_set_aside_and_the_rest_is_written(pg_url: str) -> None:
    upgrade(pg_url)
    hub, repo, writer, clock = _setup(pg_url, hold_s=0.0)
    hub.emit(Event(kind=EventKind.LOG, ts=1.0, source="log", message="fine", engine="decode-0"))
    # an xid too large for its INTEGER column: Postgres refuses the row for its content
    hub.emit(Event(kind=EventKind.LOG, ts=2.0, source="log", message="bad", engine="decode-0", xid=2**40))
    hub.emit(StepRecord(engine="decode-0", ts=3.0, step=3, running=1, halves=HALF_STATS))
    asyncio.run(writer.flush())
    assert writer.db_up is True and writer.rejected == 1
    assert [e["message"] for e in repo.list_events()] == ["fine"]
    assert [s["step"] for s in repo.recent_steps("decode-0", since=0)] == [3]


def test_nul_bytes_in_events_are_stored_on_postgres(pg_url: str) -> None:
    upgrade(pg_url)
    hub, repo, writer, _ = _setup(pg_url, hold_s=0.0)
    hub.emit(Event(kind=EventKind.LOG, ts=1.0, source="log", message="a\x00b", engine="decode-0", lines=["x\x00y"], data={"k\x00": "v\x00"}))
    writer.offer_fingerprint("decode-0", {"vllm_version": "0.32\x00", "model": "m\x00"})
    asyncio.run(writer.flush())
    assert writer.db_up is True and writer.rejected == 0 and writer.last_error in (None, "")
    [eng] = [e for e in repo.list_engines() if e["name"] == "decode-0"]
    assert eng["fingerprint"]["model"] == "m\ufffd"
    [ev] = repo.list_events()
    assert ev["message"] == "a\ufffdb" and ev["data"]["lines"] == ["x\ufffdy"]


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_every_step_column_is_stored_as_its_value_or_null_on_both_databases(db: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}" if db == "sqlite" else request.getfixturevalue("pg_url")
    upgrade(url)
    hub, repo, writer, _ = _setup(url, hold_s=0.0)
    hub.emit(
        StepRecord(
            engine="decode-0",
            ts=5.5,
            step=7,
            run=31,
            running=3,
            waiting=2,
            kv_cache_usage=1,
            preemptions=1,
            prompt_tokens=40,
            generation_tokens=3,
            halves=HALF_STATS,
        )
    )
    hub.emit(StepRecord(engine="decode-0", ts=6.5, step=8, run=31, waiting=4, halves=HALF_STATS))
    asyncio.run(writer.flush())
    first, second = repo.recent_steps("decode-0", since=0)
    assert (first["ts"], first["step"], first["running"], first["waiting"], first["preemptions"]) == (5.5, 7, 3, 2, 1)
    assert (first["prompt_tokens"], first["generation_tokens"]) == (40, 3)
    assert first["kv_cache_usage"] == 1.0 and isinstance(first["kv_cache_usage"], float)
    assert second["waiting"] == 4 and second["running"] is None and second["kv_cache_usage"] is None
    assert second["prompt_tokens"] is None and second["mirror_rows"] is None and second["host_blocks"] is None


def test_a_step_whose_figure_no_column_holds_is_set_aside_and_the_other_steps_are_written(pg_url: str) -> None:
    upgrade(pg_url)
    hub, repo, writer, _ = _setup(pg_url, hold_s=0.0)
    hub.emit(StepRecord(engine="decode-0", ts=1.0, step=1, running=1, halves=HALF_STATS))
    hub.emit(StepRecord(engine="decode-0", ts=2.0, step=2, running=2**40, halves=HALF_STATS))  # too large for INTEGER
    hub.emit(StepRecord(engine="decode-0", ts=3.0, step=3, running=1, halves=HALF_STATS))
    asyncio.run(writer.flush())
    assert writer.db_up is True and hub.view.dropped == 1  # set aside by ingest, counted
    assert [s["step"] for s in repo.recent_steps("decode-0", since=0)] == [1, 3]


SECRET_FACTS = {
    "vllm_version": "0.32.0",
    "env": {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
    "kv_transfer_config": {"kv_connector_extra_config": {"backend": "redis://u:Pa55word@cache:6379", "nested": {"auth": "Bearer abc.def"}}},
    "argv": ["vllm", "serve", "m", "--api-key", "sk-topsecret-123"],
}


def test_the_engines_table_and_event_rows_keep_no_secret(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    upgrade(url)
    hub, repo, writer, _ = _setup(url, hold_s=0.0)
    writer.offer_fingerprint("decode-0", SECRET_FACTS)
    hub.emit(
        Event(
            kind=EventKind.LOG,
            ts=1.0,
            source="log",
            engine="decode-0",
            message="non-default args: {'api_key': ['sk-abcdef123456'], 'model': 'm'} password: hunter2",
        )
    )
    asyncio.run(writer.flush())
    stored = repr(repo.list_engines()) + repr(repo.list_events())
    for secret in ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "Pa55word", "abc.def", "sk-topsecret-123", "sk-abcdef123456", "hunter2"):
        assert secret not in stored, secret
    [eng] = [e for e in repo.list_engines() if e["name"] == "decode-0"]
    assert eng["vllm_version"] == "0.32.0" and eng["fingerprint"]["env"]["AWS_SECRET_ACCESS_KEY"] == "***"


def test_while_the_series_are_coarser_one_step_per_engine_per_tenth_of_a_second_is_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    upgrade(url)
    hub, repo, writer, clock = _setup(url)
    coarse = [False]
    writer.coarse = lambda: coarse[0]
    now = time.time()

    async def scenario() -> None:
        for i in range(100):  # 1 s at 100 steps/s: every step
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.01, step=i, running=1, halves=HALF_STATS))
        clock.t += 3.0  # past the writer's 2 s hold
        await writer.flush()
        for i in range(100, 200):  # the next second, handed over while coarser: 10 steps of 100
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.01, step=i, running=1, halves=HALF_STATS))
        coarse[0] = True
        clock.t += 3.0  # past the writer's 2 s hold
        await writer.flush()
        coarse[0] = False
        for i in range(200, 210):
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.01, step=i, running=1, halves=HALF_STATS))
        clock.t += 3.0  # past the writer's 2 s hold
        await writer.flush()

    asyncio.run(scenario())
    stored = [s["step"] for s in repo.recent_steps("decode-0", since=0)]
    assert stored == list(range(100)) + list(range(100, 200, 10)) + list(range(200, 210))
    assert writer.steps_thinned == 90
    # the ring keeps every step: a snapshot is not coarser
    assert [s.step for s in hub.view.steps("decode-0")][-110:] == list(range(100, 210))
