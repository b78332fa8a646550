"""The stored step series: chunks written from column batches and read back as the rows and bins
the readers always gave; steps stored one per row before 0005 upgraded and read beside them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import insert, text

from collector.columns import STEP_COLUMNS, batch_from_rows
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.models import EngineStepRow
from collector.storage.repo import Repository
from collector.storage.stepchunks import CHUNK_S


def _rows(n: int, *, start: float = 1000.0, run: int = 7, first: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "ts": start + i * 0.37,
            "step": first + i,
            "run": run,
            "running": None if i % 7 == 0 else 200 + i % 13,
            "waiting": i % 3,
            "kv_cache_usage": None if i % 5 == 0 else (i % 97) / 97,
            "preemptions": 1 if i % 50 == 0 else 0,
            "prompt_tokens": None if i % 11 == 0 else (i * 37) % 2048,
            "generation_tokens": 200 + i % 13,
            "mirror_rows": None,
            "host_blocks": 9000 - i if i % 2 else None,
        }
        for i in range(n)
    ]


def _expected(rows: list[dict[str, Any]], engine_id: int) -> list[dict[str, Any]]:
    return [{"engine_id": engine_id, **{k: r.get(k) for k in STEP_COLUMNS}} for r in sorted(rows, key=lambda r: r["ts"])]


def _repo(url: str) -> Repository:
    upgrade(url)
    return Repository(make_engine(url), host="node-a")


def test_steps_read_back_as_written_and_a_step_offered_again_is_stored_once(database_url: str) -> None:
    repo = _repo(database_url)
    rows = _rows(400)
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", rows[:250])])
    # a ring read again after a restart: steps 200-399, of which 200-249 are stored
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", rows[200:])])
    eid = repo.engines.engine_id
    with repo.database.tx() as conn:
        engine_id = eid(conn, "decode-0")
    got = repo.recent_steps("decode-0", since=0)
    assert got == _expected(rows, engine_id)
    assert repo.recent_steps("decode-0", since=rows[100]["ts"]) == _expected(rows[100:], engine_id)
    with repo.db.connect() as conn:
        assert conn.execute(text("SELECT sum(steps) FROM engine_step_chunks")).scalar_one() == 400
    repo.db.dispose()


def test_a_step_whose_halves_come_apart_is_stored_once_with_both_halves_figures(database_url: str) -> None:
    # a late half of the run before a restart is handed to the writer alone, after its other
    # half: the stored step is the later offer, its unknowns filled from the earlier one
    repo = _repo(database_url)
    stats = {
        "ts": 1000.001,
        "step": 0,
        "run": 100,
        "running": 12,
        "waiting": 3,
        "kv_cache_usage": 0.5,
        "preemptions": 0,
        "prompt_tokens": 40,
        "generation_tokens": 12,
        "mirror_rows": None,
        "host_blocks": None,
    }
    reqs = {**dict.fromkeys(STEP_COLUMNS), "ts": 1000.0, "step": 0, "run": 100, "running": 11, "mirror_rows": 5, "host_blocks": 9}
    newer = {**stats, "run": 200, "ts": 1000.2}
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", [stats, newer, reqs])])
    with repo.database.tx() as conn:
        engine_id = repo.engines.engine_id(conn, "decode-0")
    got = repo.recent_steps("decode-0", since=0)
    merged = {**stats, "ts": 1000.0, "running": 11, "mirror_rows": 5, "host_blocks": 9}
    assert got == _expected([merged, newer], engine_id)
    repo.db.dispose()


def _binned_by_sql(repo: Repository, since: float, until: float, bin_s: float) -> list[dict[str, Any]]:
    """The bins as the SQL over step rows made them before steps were chunks."""
    from sqlalchemy import Integer, cast, func, select

    from collector.storage.models import EngineRow

    offset = EngineStepRow.ts - since
    b = (func.floor(offset / bin_s) if repo.dialect == "postgresql" else cast(offset / bin_s, Integer)).label("b")
    q = (
        select(
            b,
            func.count().label("steps"),
            func.max(EngineStepRow.running).label("running"),
            func.max(EngineStepRow.waiting).label("waiting"),
            func.max(EngineStepRow.kv_cache_usage).label("kv_cache_usage"),
            func.sum(EngineStepRow.prompt_tokens).label("prompt_tokens"),
            func.sum(EngineStepRow.generation_tokens).label("generation_tokens"),
            func.sum(EngineStepRow.preemptions).label("preemptions"),
        )
        .join(EngineRow, EngineRow.id == EngineStepRow.engine_id)
        .where(EngineRow.name == "decode-0", EngineStepRow.ts >= since, EngineStepRow.ts < until)
        .group_by(b)
        .order_by(b)
    )
    with repo.db.connect() as conn:
        return [{**dict(r), "b": int(r["b"]), "t": since + int(r["b"]) * bin_s} for r in conn.execute(q).mappings()]


def test_old_rows_and_chunks_read_as_one_series_with_the_bins_the_sql_made(database_url: str) -> None:
    """A store upgraded with steps stored as rows: they read back beside the chunks written
    since, identically, and binned as the SQL over rows binned them."""
    upgrade(database_url, "0004")
    db = make_engine(database_url)
    old = _rows(300)
    with db.begin() as conn:
        conn.execute(text("INSERT INTO engines (host, name, state, first_seen, last_seen) VALUES ('node-a', 'decode-0', 'unknown', 0, 0)"))
        engine_id = conn.execute(text("SELECT id FROM engines")).scalar_one()
        conn.execute(insert(EngineStepRow), [{"engine_id": engine_id, **r} for r in old])
        conn.execute(
            text('INSERT INTO engine_scrapes (engine_id, ts, running, waiting, kv_cache_usage, "values") VALUES (:e, 5.0, 1, 0, 0.5, :v)'),
            {"e": engine_id, "v": '{"num_requests_running": 1.0}'},
        )
    db.dispose()
    repo = _repo(database_url)  # to head
    since, until, bin_s = 1000.0 + 13.3, 1000.0 + 299 * 0.37 + 0.01, 7.0  # the old rows, re-offered ones included
    sql_bins = _binned_by_sql(repo, since, until, bin_s)
    new = _rows(200, start=1000.0 + 300 * 0.37, first=300)
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", old[250:] + new)])  # 250-299 are stored rows
    assert repo.recent_steps("decode-0", since=0) == _expected(old + new, engine_id)
    assert repo.binned_steps(host="node-a", engine="decode-0", since=since, until=until, bin_s=bin_s) == sql_bins
    assert [s["values"] for s in repo.recent_scrapes("decode-0", since=0)] == [{"num_requests_running": 1.0}]
    # retention takes old rows and whole chunks alike
    pruned = repo.prune(steps_before=1000.0 + 400 * 0.37, gpu_before=0, events_before=0, snapshots_before=None)
    left = repo.recent_steps("decode-0", since=0)
    assert pruned["engine_steps"] + len(left) == 500 and pruned["engine_steps"] > 300
    assert all(s["ts"] > 1000.0 + 400 * 0.37 - CHUNK_S for s in left)
    repo.db.dispose()


def test_the_bins_match_the_sql_over_the_same_steps_as_rows(database_url: str) -> None:
    repo = _repo(database_url)
    rows = _rows(500)
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", rows)])
    got = repo.binned_steps(host="node-a", engine="decode-0", since=1003.1, until=1150.0, bin_s=2.5)
    with repo.database.tx() as conn:
        engine_id = repo.engines.engine_id(conn, "decode-0")
        conn.execute(insert(EngineStepRow), [{"engine_id": engine_id, **r} for r in rows])
    assert got == _binned_by_sql(repo, 1003.1, 1150.0, 2.5)
    assert got and all(isinstance(r["running"], int) for r in got if r["running"] is not None)
    assert np.isclose(sum(r["steps"] for r in got), sum(1 for r in rows if 1003.1 <= r["ts"] < 1150.0))
    assert repo.binned_steps(host="node-b", engine="decode-0", since=0, until=1e12, bin_s=1.0) == []
    repo.db.dispose()


def test_scrape_figures_read_back_as_written(database_url: str) -> None:
    repo = _repo(database_url)
    values = {"num_requests_running": 3.0, 'request_success_total{finished_reason="stop"}': 12.0, "rate:prompt_tokens_total": 0.25, "nan": math.inf}
    repo.write_batch(
        [], [], [], scrapes=[{"engine": "decode-0", "ts": 1.0, "running": 3.0, "waiting": None, "kv_cache_usage": 0.1, "values": values}]
    )
    [row] = repo.recent_scrapes("decode-0", since=0)
    assert row["values"] == values and (row["running"], row["waiting"]) == (3.0, None)
    assert set(row) == {"id", "engine_id", "ts", "running", "waiting", "kv_cache_usage", "values"}
    repo.db.dispose()


def test_the_per_second_series_sums_and_maxima_each_second_once(database_url: str) -> None:
    repo = _repo(database_url)
    rows = _rows(100, start=2000.0)
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", rows[:60])])
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", rows[40:])])  # 40-59 again: counted once
    with repo.db.connect() as conn:
        got = conn.execute(
            text(
                "SELECT floor(ts), sum(steps), max(running), max(kv_cache_usage), sum(prompt_tokens), sum(preemptions), max(mirror_rows) "
                "FROM engine_step_seconds GROUP BY floor(ts) ORDER BY floor(ts)"
            )
        ).all()
    want: dict[int, list[Any]] = {}
    for r in rows:
        w = want.setdefault(math.floor(r["ts"]), [0, None, None, None, None])
        w[0] += 1
        w[1] = r["running"] if w[1] is None else max(w[1], r["running"] or w[1])
        w[2] = r["kv_cache_usage"] if w[2] is None else max(w[2], r["kv_cache_usage"] or w[2])
        w[3] = r["prompt_tokens"] if w[3] is None else w[3] + (r["prompt_tokens"] or 0)
        w[4] = r["preemptions"] if w[4] is None else w[4] + r["preemptions"]
    assert [(int(t), int(n), run, kv, p, pre, m) for t, n, run, kv, p, pre, m in got] == [(t, *w, None) for t, w in sorted(want.items())]
    # retention keeps the seconds on their own horizon
    pruned = repo.prune(steps_before=1e12, gpu_before=0, events_before=0, snapshots_before=None, step_seconds_before=2010.0)
    assert pruned["engine_steps"] == 100 and pruned["engine_step_seconds"] >= 10
    with repo.db.connect() as conn:
        assert conn.execute(text("SELECT min(ts) FROM engine_step_seconds")).scalar_one() >= 2010.0
    repo.db.dispose()


def test_a_damaged_chunk_is_left_out_not_raised(sqlite_url: str) -> None:
    repo = _repo(sqlite_url)
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", _rows(40))])  # 0-39: two chunks (windows at 1000 and 1010)
    with repo.db.begin() as conn:
        conn.execute(text("UPDATE engine_step_chunks SET payload = :p WHERE first_step = 0"), {"p": b"not zlib"})
    kept = repo.recent_steps("decode-0", since=0)
    assert kept and all(s["step"] >= 27 for s in kept)  # the second window's steps, the first's unreadable
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", _rows(60))])  # the writer goes on
    assert [s["step"] for s in repo.recent_steps("decode-0", since=0)][-1] == 59
    repo.db.dispose()


def test_a_downgrade_writes_the_chunks_back_as_rows(database_url: str) -> None:
    from collector.storage.migrate import downgrade

    repo = _repo(database_url)
    rows = _rows(120)
    repo.write_batch([], [], [], step_batches=[batch_from_rows("decode-0", rows)])
    repo.write_batch(
        [], [], [], scrapes=[{"engine": "decode-0", "ts": 1.0, "running": 1.0, "waiting": 0.0, "kv_cache_usage": 0.5, "values": {"a": 1.5}}]
    )
    repo.db.dispose()
    downgrade(database_url, "0004")
    db = make_engine(database_url)
    with db.connect() as conn:
        got = conn.execute(text(f"SELECT {', '.join(STEP_COLUMNS)} FROM engine_steps ORDER BY ts")).all()
        values = conn.execute(text('SELECT "values" FROM engine_scrapes')).scalar_one()
    db.dispose()
    assert [tuple(r) for r in got] == [tuple(r[k] for k in STEP_COLUMNS) for r in rows]
    assert (values if isinstance(values, dict) else __import__("json").loads(values)) == {"a": 1.5}
