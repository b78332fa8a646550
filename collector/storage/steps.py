"""The stored step series: written as chunks (``stepchunks``), read back as steps.

Writing: one engine's steps (column batches) become chunks, less any step already stored (a
ring read again after a restart offers steps the store has: found through the chunks whose step
range reaches the new ones, one index lookup per engine and run when there are none, and through
``engine_steps``, the rows stored before 0005, until it is empty). Within what is written at once,
a step offered twice is written once, as last offered.

Reading: the chunks (and old rows) whose time reaches the window, decoded into one column array
in time order; ``recent_steps`` and ``binned_steps`` give the rows and bins they always gave,
None for a figure nobody measured.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from collector.columns import INT_NULL, STEP_COLUMNS, STEP_DTYPE, to_python
from collector.storage.database import Database
from collector.storage.models import EngineRow, EngineStepChunkRow, EngineStepRow, EngineStepSecondRow
from collector.storage.stepchunks import ENCODING, chunks_of, decode, encode

log = logging.getLogger(__name__)

Cols = npt.NDArray[np.void]
_LEGACY = [getattr(EngineStepRow, c) for c in STEP_COLUMNS]
_C = EngineStepChunkRow


def rows_to_cols(rows: Sequence[Sequence[Any]]) -> Cols:
    """Rows of ``STEP_COLUMNS`` values (None for unknown; a run nobody gave is 0, as the
    column's default was) as one column array."""
    cols = np.empty(len(rows), dtype=STEP_DTYPE)
    for i, name in enumerate(STEP_COLUMNS):
        null: Any = np.nan if STEP_DTYPE[name].kind == "f" else 0 if name == "run" else INT_NULL
        cols[name] = [null if r[i] is None else r[i] for r in rows]
    return cols


# The per-bin and per-second figures: (column, how), in ``engine_step_seconds``' order.
MAXIMA = ("running", "waiting", "kv_cache_usage")
SUMS = ("preemptions", "prompt_tokens", "generation_tokens")
SECOND_FIGURES = (*MAXIMA, *SUMS, "mirror_rows", "host_blocks")
_HOW = {**dict.fromkeys(MAXIMA, "max"), **dict.fromkeys(SUMS, "sum"), "mirror_rows": "max", "host_blocks": "max"}


def fold(cols: Cols, group: npt.NDArray[np.int64], names: Sequence[str]) -> tuple[list[int], list[int], dict[str, list[Any]]]:
    """``cols`` grouped by ``group`` (one number per step): the groups in order, their step
    counts, and each of ``names`` per group, its maximum or sum (``_HOW``), None where no step
    of the group carried it."""
    if not np.all(group[1:] >= group[:-1]):
        order = np.argsort(group, kind="stable")
        group, cols = group[order], cols[order]
    starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
    groups = group[starts]
    counts = np.diff(np.append(starts, len(group)))
    out: dict[str, list[Any]] = {}
    for name in names:
        col = cols[name]
        known = ~np.isnan(col) if col.dtype.kind == "f" else col != INT_NULL
        any_known = np.add.reduceat(known.astype(np.int64), starts) > 0
        if _HOW[name] == "max":
            low = -np.inf if col.dtype.kind == "f" else INT_NULL  # the int32 columns' least value
            values = np.maximum.reduceat(np.where(known, col, low), starts)
        else:
            values = np.add.reduceat(np.where(known, col, 0).astype(np.int64), starts)
        out[name] = [v if k else None for v, k in zip(values.tolist(), any_known.tolist(), strict=True)]
    return groups.tolist(), counts.tolist(), out


class StepStore:
    def __init__(self, database: Database) -> None:
        self.d = database
        # engine_steps gets no new rows since 0005: once seen empty it stays so
        self._legacy_empty = False
        self._statements: dict[str, str] = {}

    # -- writing ----------------------------------------------------------------------------
    def write(self, conn: Connection, batches: dict[int, list[Cols]]) -> int:
        """Store each engine's steps (``batches``: by engine id), in this transaction; returns
        how many were new. One driver-level ``executemany`` for every chunk."""
        rows: list[tuple[Any, ...]] = []
        seconds: list[tuple[Any, ...]] = []
        for engine_id, parts in batches.items():
            cols = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if len(cols):
                new = self._new_steps(conn, engine_id, cols)
                rows += [
                    (engine_id, c.run, c.first_step, c.last_step, c.ts_min, c.ts_max, len(c.cols), ENCODING, encode(c.cols)) for c in chunks_of(new)
                ]
                seconds += second_rows(engine_id, new)
        if rows:
            conn.exec_driver_sql(self._sql("insert"), rows)
        if seconds:
            conn.exec_driver_sql(self._sql("seconds"), seconds)
        return sum(int(r[6]) for r in rows)

    def _new_steps(self, conn: Connection, engine_id: int, cols: Cols) -> Cols:
        """``cols`` less the steps already stored, a step offered twice once (``merge_offers``);
        by run, then time."""
        run, step = cols["run"], cols["step"]
        if not (np.all(run == run[0]) and np.all(step[1:] > step[:-1])):  # the common case: one run, in step order
            cols = merge_offers(cols)
        runs = np.unique(cols["run"])
        kept: list[Cols] = []
        for r in runs:
            mine = cols if len(runs) == 1 else cols[cols["run"] == r]
            stored = self._stored_steps(conn, engine_id, int(r), int(mine["step"][0]), int(mine["step"][-1]))
            if len(stored):
                mine = mine[~np.isin(mine["step"], stored)]
            ts = mine["ts"]
            kept.append(mine if np.all(ts[1:] >= ts[:-1]) else mine[np.argsort(ts, kind="stable")])
        return kept[0] if len(kept) == 1 else np.concatenate(kept)

    def _stored_steps(self, conn: Connection, engine_id: int, run: int, lo: int, hi: int) -> npt.NDArray[np.int64]:
        """The steps of ``run`` between ``lo`` and ``hi`` the store already has."""
        found = []
        for first, last, n, encoding, payload in conn.exec_driver_sql(self._sql("stored"), (engine_id, run, lo, hi)):
            got = _decoded([(n, encoding, payload)])
            # an unreadable chunk holds its whole range: those steps are not written again
            found.append(got[0]["step"] if got else np.arange(int(first), int(last) + 1, dtype=np.int64))
        if not self._legacy_empty and not self._legacy_gone(conn):
            legacy = select(EngineStepRow.step).where(
                EngineStepRow.engine_id == engine_id, EngineStepRow.run == run, EngineStepRow.step.between(lo, hi)
            )
            found.append(np.array(conn.execute(legacy).scalars().all(), dtype=np.int64))
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

    def _legacy_gone(self, conn: Connection) -> bool:
        """Whether ``engine_steps`` is empty (remembered once it is: it gets no new rows)."""
        if conn.execute(select(EngineStepRow.id).limit(1)).first() is None:
            self._legacy_empty = True
        return self._legacy_empty

    def _sql(self, name: str) -> str:
        """The write path's statements in the driver's own form: built once, no SQLAlchemy
        expression per flush (it was most of the write's CPU)."""
        sql = self._statements.get(name)
        if sql is None:
            mark = self.d.param_mark
            if name in ("insert", "seconds"):
                table = _C.__tablename__ if name == "insert" else EngineStepSecondRow.__tablename__
                cols = (
                    ("engine_id", "run", "first_step", "last_step", "ts_min", "ts_max", "steps", "encoding", "payload")
                    if name == "insert"
                    else ("engine_id", "ts", "steps", *SECOND_FIGURES)
                )
                sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join([mark] * len(cols))})"
            else:
                sql = (
                    f"SELECT first_step, last_step, steps, encoding, payload FROM {_C.__tablename__} "  # noqa: S608 - our own names
                    f"WHERE engine_id = {mark} AND run = {mark} AND last_step >= {mark} AND first_step <= {mark}"
                )
            self._statements[name] = sql
        return sql

    # -- reading ----------------------------------------------------------------------------
    def load(self, conn: Connection, engine_id: int, *, since: float, until: float | None = None) -> Cols:
        """The engine's steps with ``since <= ts < until``, in time order."""
        q = select(_C.steps, _C.encoding, _C.payload).where(_C.engine_id == engine_id, _C.ts_max >= since)
        if until is not None:
            q = q.where(_C.ts_min < until)
        chunks = conn.execute(q).all()
        legacy = self._legacy(conn, engine_id, since, until)
        cols = np.empty(sum(int(n) for n, _, _ in chunks) + len(legacy), dtype=STEP_DTYPE)
        at = 0
        for n, encoding, payload in chunks:  # decoded in place: no array per chunk to concatenate
            try:
                decode(bytes(payload), int(n), str(encoding), out=cols[at : at + int(n)])
            except (ValueError, TypeError) as exc:
                log.warning("a stored step chunk is unreadable, left out: %s", exc)
                continue
            at += int(n)
        cols[at : at + len(legacy)] = legacy
        cols = cols[: at + len(legacy)]
        ts = cols["ts"]
        keep = ts >= since if until is None else (ts >= since) & (ts < until)
        cols = cols[keep]
        return cols[np.argsort(cols["ts"], kind="stable")]

    def _legacy(self, conn: Connection, engine_id: int, since: float, until: float | None) -> Cols:
        if self._legacy_empty or self._legacy_gone(conn):
            return np.empty(0, dtype=STEP_DTYPE)
        q = select(*_LEGACY).where(EngineStepRow.engine_id == engine_id, EngineStepRow.ts >= since)
        if until is not None:
            q = q.where(EngineStepRow.ts < until)
        return rows_to_cols(conn.execute(q).all())

    def recent(self, conn: Connection, engine_id: int, *, since: float) -> list[dict[str, Any]]:
        cols = self.load(conn, engine_id, since=since)
        return [{"engine_id": engine_id, **{k: to_python(v) for k, v in zip(STEP_COLUMNS, row, strict=True)}} for row in cols.tolist()]

    def binned(self, conn: Connection, engine_id: int, *, since: float, until: float, bin_s: float) -> list[dict[str, Any]]:
        cols = self.load(conn, engine_id, since=since, until=until)
        if not len(cols):
            return []
        b = ((cols["ts"] - since) / bin_s).astype(np.int64)  # never negative: truncation is floor
        names = ("running", "waiting", "kv_cache_usage", "prompt_tokens", "generation_tokens", "preemptions")
        bins, counts, figures = fold(cols, b, names)
        return [
            {"b": x, "steps": n, **{k: figures[k][i] for k in names}, "t": since + x * bin_s}
            for i, (x, n) in enumerate(zip(bins, counts, strict=True))
        ]

    # -- retention --------------------------------------------------------------------------
    def prune_seconds(self, conn: Connection, *, before: float) -> int:
        """Delete the per-second rows before ``before`` (every host's); returns how many."""
        s = EngineStepSecondRow
        # engine by engine through the (engine_id, ts) index, in one statement
        return int(conn.execute(delete(s).where(s.engine_id.in_(select(EngineRow.id)), s.ts < before)).rowcount)

    def prune(self, conn: Connection, *, before: float) -> int:
        """Delete the chunks wholly before ``before`` (every host's, as rows were) and old rows
        before it; returns the steps deleted."""
        old = (_C.engine_id.in_(select(EngineRow.id)), _C.ts_max < before)  # the (engine_id, ts_max) index per engine
        gone = int(conn.execute(select(func.coalesce(func.sum(_C.steps), 0)).where(*old)).scalar_one())
        if gone:
            conn.execute(delete(_C).where(*old))
        if not self._legacy_empty:
            gone += conn.execute(delete(EngineStepRow).where(EngineStepRow.ts < before)).rowcount
        return gone


def merge_offers(cols: Cols) -> Cols:
    """``cols`` by (run, step), each step once: a step offered twice (its two halves handed
    to the writer apart: a late half of a run before a restart) is its last offer, with the
    figures that offer does not know taken from the offers before it."""
    cols = cols[np.lexsort((cols["step"], cols["run"]))]  # stable: the last offer of a step stays last
    run, step = cols["run"], cols["step"]
    last = np.ones(len(cols), dtype=bool)
    last[:-1] = (run[1:] != run[:-1]) | (step[1:] != step[:-1])
    if last.all():
        return cols
    cols = cols.copy()
    for i in np.flatnonzero(~last).tolist():  # rare: fill the next offer's unknowns from this one
        for name in STEP_COLUMNS:
            col = cols[name]
            if _unknown(col[i + 1]) and not _unknown(col[i]):
                col[i + 1] = col[i]
    return cols[last]


def _unknown(v: Any) -> bool:
    return bool(np.isnan(v)) if isinstance(v, np.floating) else int(v) == INT_NULL


def second_rows(engine_id: int, cols: Cols) -> list[tuple[Any, ...]]:
    """``engine_step_seconds`` rows of ``cols`` (in the driver's form)."""
    if not len(cols):
        return []
    seconds, counts, figures = fold(cols, np.floor(cols["ts"]).astype(np.int64), SECOND_FIGURES)
    return [(engine_id, float(t), n, *(figures[k][i] for k in SECOND_FIGURES)) for i, (t, n) in enumerate(zip(seconds, counts, strict=True))]


def _decoded(rows: Iterable[Any]) -> list[Cols]:
    """The columns of chunk rows (steps, encoding, payload); a chunk that does not decode (a
    damaged file) is logged and left out, never raised to the writer or a reader."""
    out = []
    for n, encoding, payload in rows:
        try:
            out.append(decode(bytes(payload), int(n), str(encoding)))
        except (ValueError, TypeError) as exc:
            log.warning("a stored step chunk is unreadable, left out: %s", exc)
    return out


def count_stored_steps(url: str, *, engine: str | None = None) -> tuple[int, int]:
    """(steps stored, distinct engine/run/step keys among them) in the store at ``url``, every
    host's, or one engine's by name: the check that every step is stored once (tests, benches,
    scripts; the chunks are decoded, so this reads the whole series)."""
    from collector.storage.connect import make_engine  # noqa: PLC0415 - a tool's entry, not the sidecar's

    db = make_engine(url)
    keys: list[npt.NDArray[np.int64]] = []
    try:
        with db.connect() as conn:
            ids = select(EngineRow.id) if engine is None else select(EngineRow.id).where(EngineRow.name == engine)
            for engine_id, n, encoding, payload in conn.execute(select(_C.engine_id, _C.steps, _C.encoding, _C.payload).where(_C.engine_id.in_(ids))):
                cols = decode(payload, n, encoding)
                keys.append(np.stack([np.full(n, engine_id), cols["run"], cols["step"]], axis=1))
            legacy = conn.execute(
                select(EngineStepRow.engine_id, EngineStepRow.run, EngineStepRow.step).where(EngineStepRow.engine_id.in_(ids))
            ).all()
            if legacy:
                keys.append(np.array(legacy, dtype=np.int64))
    finally:
        db.dispose()
    if not keys:
        return 0, 0
    every = np.concatenate(keys)
    return len(every), len(np.unique(every, axis=0))
