"""The workload log: what it keeps of each request, its bounds, and the export at a fault."""

from __future__ import annotations

import pytest

from collector.channel.codec import decode, encode_arrival, encode_end
from collector.ingest.workload import WorkloadLog, concurrency_series
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd


def arrive(
    rid: str,
    ts: float,
    *,
    prompt_len: int | None = 32000,
    max_tokens: int | None = 2000,
    engine: str = "decode-0",
    n: int | None = 1,
    ignore_eos: bool | None = True,
    has_stop: bool | None = False,
) -> WorkloadBatch:
    return WorkloadBatch(engine=engine, ts=ts, records=[WorkloadArrival(rid, ts, prompt_len, max_tokens, n, ignore_eos, has_stop)])


def end(rid: str, ts: float, *, output_len: int = 2000, finish: str = "length", cached: int | None = 0, engine: str = "decode-0") -> WorkloadBatch:
    return WorkloadBatch(engine=engine, ts=ts, records=[WorkloadEnd(rid, ts, output_len, finish, cached)])


def rows(export: dict) -> list[dict]:
    cols = export["requests"]["columns"]
    return [{k: cols[k][i] for k in cols} for i in range(len(cols["id"]))]


def test_each_request_keeps_its_shape_and_how_it_ended_at_the_fault() -> None:
    log = WorkloadLog()
    for rec in (
        arrive("a", 100.0),
        arrive("b", 101.0, max_tokens=16, ignore_eos=False, has_stop=True, n=2),
        end("a", 110.0, cached=1024),
        arrive("c", 111.0),
        end("b", 112.0, output_len=7, finish="aborted"),
        arrive("d", 113.0),
    ):
        log.add(rec)
    out = log.export(120.0, crashed=True)
    by_id = {r["id"]: r for r in rows(out)}
    assert by_id["a"] == {
        "id": "a",
        "arrival_offset": 0.0,
        "prompt_len": 32000,
        "max_tokens": 2000,
        "n": 1,
        "ignore_eos": True,
        "has_stop": False,
        "end_offset": 10.0,
        "output_len": 2000,
        "finish": "length",
        "outcome": "finished",
        "cached_tokens": 1024,
    }
    assert (by_id["b"]["n"], by_id["b"]["ignore_eos"], by_id["b"]["has_stop"]) == (2, False, True)
    assert (by_id["b"]["outcome"], by_id["b"]["output_len"]) == ("aborted", 7)
    # arrived, never ended, and the engine died: failed by the crash, with nothing invented
    assert by_id["c"]["outcome"] == by_id["d"]["outcome"] == "failed_by_crash"
    assert by_id["c"]["output_len"] is None and by_id["c"]["cached_tokens"] is None
    assert out["counts"] == {"requests": 4, "finished": 1, "aborted": 1, "error": 0, "failed_by_crash": 2, "in_flight": 0}
    assert out["t0"] == 100.0 and out["crashed"] is True and out["truncated"]["any"] is False
    # no prompt content anywhere, only lengths
    assert "prompt" not in out["requests"]["columns"]


def test_without_a_crash_open_requests_are_in_flight_and_later_records_do_not_count() -> None:
    log = WorkloadLog()
    log.add(arrive("a", 10.0))
    log.add(arrive("b", 11.0))
    log.add(end("a", 30.0))  # after the snapshot's time
    log.add(arrive("c", 31.0))
    out = log.export(20.0, crashed=False)
    assert [(r["id"], r["outcome"]) for r in rows(out)] == [("a", "in_flight"), ("b", "in_flight")]
    assert out["truncated"]["arrived_after_fault"] == 1


def test_the_concurrency_series_steps_at_every_arrival_and_end() -> None:
    log = WorkloadLog()
    for rec in (arrive("a", 0.0), arrive("b", 1.0), end("a", 2.0), arrive("c", 2.0), end("b", 3.0), end("c", 4.0), arrive("d", 5.0)):
        log.add(rec)
    out = log.export(6.0, crashed=True)
    # at t=2 "a" ends as "c" arrives: an end first, so the level stays 2, never 3
    assert out["concurrency"] == [[0.0, 1], [1.0, 2], [2.0, 2], [3.0, 1], [4.0, 0], [5.0, 1], [6.0, 1]]
    assert max(level for _, level in out["concurrency"]) == 2


def test_bounded_by_count_oldest_first_and_says_so() -> None:
    log = WorkloadLog(max_requests=3)
    for i in range(5):
        log.add(arrive(f"r{i}", float(i)))
        log.add(end(f"r{i}", i + 0.5))
    out = log.export(10.0, crashed=True)
    assert [r["id"] for r in rows(out)] == ["r2", "r3", "r4"]
    assert out["truncated"]["dropped_by_count"] == 2 and out["truncated"]["any"] is True
    assert out["t0"] == 2.0


def test_bounded_by_age_but_a_long_request_still_running_is_kept() -> None:
    log = WorkloadLog(max_age_s=100)
    log.add(arrive("long", 0.0))  # still running at the fault: part of the load
    log.add(arrive("old", 1.0))
    log.add(end("old", 2.0))
    log.add(arrive("new", 150.0))
    out = log.export(160.0, crashed=False)  # a manual snapshot: the engine lives on
    assert [r["id"] for r in rows(out)] == ["long", "new"]  # "old" ended before the window
    assert out["window"]["max_age_s"] == 100 and out["window"]["end"] == 160.0
    # pruning while adding: once "long" ends, the old ended requests go
    log.add(end("long", 300.0))
    log.add(arrive("later", 450.0))
    assert log.dropped_by_age == 2 and len(log) == 2  # "long" and "old"; "new" and "later" are open


def test_an_end_read_before_its_arrival_is_matched_and_ids_may_be_reused() -> None:
    log = WorkloadLog()
    log.add(end("x", 5.0, output_len=3))  # the end's ring was read first
    log.add(arrive("x", 1.0, prompt_len=10))
    log.add(arrive("x", 6.0, prompt_len=20))  # the client reuses the id once the first ended
    out = log.export(9.0, crashed=True)
    assert [(r["prompt_len"], r["output_len"], r["outcome"]) for r in rows(out)] == [(10, 3, "finished"), (20, None, "failed_by_crash")]
    assert out["truncated"]["ends_without_arrival"] == 0


def test_engines_are_apart_and_unknown_values_are_null() -> None:
    log = WorkloadLog()
    log.add(arrive("a", 1.0, engine="prefill-0", max_tokens=1))
    log.add(arrive("a", 2.0, prompt_len=5, max_tokens=None, n=None, ignore_eos=None, has_stop=None))
    out = log.export(3.0, crashed=True, engine="decode-0")
    (row,) = rows(out)
    assert row["prompt_len"] == 5 and row["max_tokens"] is None and row["n"] is None and row["ignore_eos"] is None
    assert len(rows(log.export(3.0, crashed=True))) == 2


def test_an_empty_log_exports_an_empty_workload() -> None:
    out = WorkloadLog().export(50.0, crashed=True)
    assert out["counts"]["requests"] == 0 and out["concurrency"] == [] and out["requests"]["columns"]["id"] == []


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        WorkloadLog(max_requests=-1)
    with pytest.raises(ValueError):
        WorkloadLog(max_age_s=0)


def test_zero_requests_turns_the_log_off() -> None:
    log = WorkloadLog(max_requests=0)
    log.add(arrive("a", 1.0))
    assert len(log) == 0 and log.export(2.0, crashed=True)["counts"]["requests"] == 0


def test_concurrency_series_closes_at_until() -> None:
    assert concurrency_series([0.0], [None], 3.0) == [[0.0, 1], [3.0, 1]]


def test_a_crash_closes_what_was_open_and_a_restarted_engine_starts_afresh() -> None:
    log = WorkloadLog()
    for rec in (arrive("a", 1.0), end("a", 2.0), arrive("b", 3.0), arrive("c", 3.5)):
        log.add(rec)
    first = log.export(5.0, crashed=True)
    assert first == log.export(5.0, crashed=True)  # an export changes nothing
    log.died(5.0)  # ingest routed the crash to the engine
    assert first == log.export(5.0, crashed=True)  # the snapshot and its amendment agree
    assert [r["outcome"] for r in rows(first)] == ["finished", "failed_by_crash", "failed_by_crash"]
    # the engine restarts under the same name; its requests are a new load
    for rec in (arrive("x", 100.0), end("x", 101.0), arrive("y", 102.0)):
        log.add(rec)
    second = log.export(110.0, crashed=True)
    assert [(r["id"], r["outcome"]) for r in rows(second)] == [("x", "finished"), ("y", "failed_by_crash")]
    assert second["window"]["after_death_at"] == 5.0 and second["t0"] == 100.0
    # b and c are no longer in flight: the concurrency after the restart is the new engine's own
    assert max(level for _, level in second["concurrency"]) == 1
    # an end that comes after the crash closed its request is not matched to anything
    log.add(end("b", 6.0))
    assert [r["id"] for r in rows(log.export(110.0, crashed=True))] == ["x", "y"]


def test_records_just_after_a_fault_time_to_the_second_are_before_the_death() -> None:
    """vLLM's log gives the fault to the second: the engine's records a moment later (it was
    still running) belong to the load before the death, even when read after the capture."""
    log = WorkloadLog()
    log.add(arrive("a", 10.2))
    log.add(arrive("b", 10.3))
    first = log.export(10.0, crashed=True)  # the CUDA error's log line says 10 s
    log.died(10.0)
    assert [r["outcome"] for r in rows(first)] == ["failed_by_crash", "failed_by_crash"]
    log.add(end("a", 10.6))  # read after the first capture
    amended = log.export(10.0, crashed=True)
    assert [(r["id"], r["outcome"]) for r in rows(amended)] == [("a", "finished"), ("b", "failed_by_crash")]
    assert max(level for _, level in amended["concurrency"]) == 2


def test_numbers_a_column_cannot_hold_are_null_not_an_error() -> None:
    # the recorder's record says so (its null bits), and the log keeps them as null
    log = WorkloadLog()
    for payload in (
        encode_arrival("a", 1.0, float("nan"), 1 << 70, float("inf"), True, False),  # type: ignore[arg-type]
        encode_end("a", 2.0, -(1 << 63), "length", None),
    ):
        _, batch = decode(payload, engine="decode-0")
        assert isinstance(batch, WorkloadBatch)
        log.add(batch)
    (row,) = rows(log.export(3.0, crashed=False))
    assert (row["prompt_len"], row["max_tokens"], row["n"], row["output_len"]) == (None, None, None, None)
    assert row["outcome"] == "finished" and row["finish"] == "length"


def test_a_long_run_keeps_its_bounds_and_its_order_across_the_columns_cut() -> None:
    log = WorkloadLog(max_requests=500, max_age_s=50.0)
    for i in range(5000):
        log.add(arrive(f"r{i}", float(i) / 10, prompt_len=i))
        if i % 7:  # every 7th never ends: kept until the count bound drops it
            log.add(end(f"r{i}", float(i) / 10 + 1.0, output_len=i))
    assert len(log) == 500
    out = log.export(500.0, crashed=False)
    got = rows(out)
    assert [r["prompt_len"] for r in got] == list(range(4500, 5000))
    assert all(r["output_len"] == r["prompt_len"] for r in got if r["outcome"] == "finished")
    assert {r["outcome"] for r in got if r["prompt_len"] % 7 == 0} == {"in_flight"}
    assert log.dropped_by_count + log.dropped_by_age == 4500


def test_one_batch_is_what_its_records_one_at_a_time_make() -> None:
    one, many = WorkloadLog(), WorkloadLog()
    records = [*arrive("a", 1.0).records, *arrive("b", 1.5).records, *end("a", 2.0).records, *end("c", 2.5).records, *arrive("c", 0.9).records]
    for rec in records:
        one.add(WorkloadBatch(engine="decode-0", ts=rec.ts, records=[rec]))
    many.add(WorkloadBatch(engine="decode-0", ts=2.5, records=records))
    assert one.export(3.0, crashed=False) == many.export(3.0, crashed=False)
    assert [(r["id"], r["outcome"]) for r in rows(many.export(3.0, crashed=False))] == [("a", "finished"), ("b", "in_flight"), ("c", "finished")]


def test_the_deaths_of_one_incident_do_not_empty_its_own_export() -> None:
    """Ingest records a death for each crash event routed to the engine: a log line stamped to
    the second can say 9.0 for a fault whose Xid says 9.6. The export at 9.6 is still the load
    before the fault; a later fault's export, after a restart, starts after the death."""
    log = WorkloadLog()
    log.add(arrive("a", 5.0))
    log.add(arrive("b", 8.0))
    log.died(9.0)  # the CUDA error's log line
    log.died(9.6)  # the Xid
    out = log.export(9.6, crashed=True)
    assert [(r["id"], r["outcome"]) for r in rows(out)] == [("a", "failed_by_crash"), ("b", "failed_by_crash")]
    assert out["window"]["after_death_at"] is None
    log.add(arrive("c", 100.0))
    later = log.export(110.0, crashed=True)
    assert [r["id"] for r in rows(later)] == ["c"] and later["window"]["after_death_at"] == 9.6
