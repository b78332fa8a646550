from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.channel import work_columns
from collector.channel.codec import CodecError, decode_work
from collector.channel.wire import encode_arrival, encode_end
from collector.channel.work_columns import WorkColumns, decode_work_records
from collector.ingest.workload import WorkloadLog
from collector.model import WorkloadArrival, WorkloadBatch, WorkloadEnd

counts = st.one_of(st.none(), st.integers(0, 2**63 - 1))
flags = st.one_of(st.none(), st.booleans())
ids = st.text(min_size=1, max_size=40).filter(lambda s: "\0" not in s)
ascii_ids = st.text(alphabet="abcdef0123456789-", min_size=1, max_size=40)
times = st.floats(0, 2e9, allow_nan=False)
arrivals = st.builds(encode_arrival, ids, times, counts, counts, counts, flags, flags)
ends = st.builds(encode_end, ids, times, counts, st.one_of(st.none(), st.sampled_from(["stop", "length", "abort", "ärger"])), counts)


def one_by_one(payloads: list[bytes]) -> tuple[list[object], list[str]]:
    records, errors = [], []
    for p in payloads:
        try:
            records.append(decode_work(p))
        except CodecError as exc:
            errors.append(str(exc))
    return records, errors


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(arrivals, ends), min_size=work_columns.COLUMNS_FROM, max_size=work_columns.COLUMNS_FROM + 40))
def test_a_large_read_decodes_as_columns_to_the_records_decode_work_makes(payloads: list[bytes]) -> None:
    records, errors = decode_work_records(payloads)
    assert type(records) is WorkColumns and not errors
    assert list(records) == one_by_one(payloads)[0]
    assert records == one_by_one(payloads)[0] and len(records) == len(payloads)
    assert records[-1] == decode_work(payloads[-1]) and records[1:3] == [decode_work(p) for p in payloads[1:3]]


def _bad(p: bytes, how: int) -> bytes:
    if how == 0:  # an unknown event
        return p[:1] + b"\x07" + p[2:]
    if how == 1:  # a count marked unknown that holds a value
        return p[:2] + bytes([p[2] | 1]) + p[3:6] + p[6:14] + struct.pack("<q", 5) + p[22:]
    if how == 2:  # a negative time
        return p[:6] + struct.pack("<d", -1.0) + p[14:]
    if how == 3:  # an id that is not UTF-8
        return p[:38] + b"\xff" + p[39:]
    if how == 4:  # a NUL in the id
        return p[:38] + b"\0" + p[39:]
    return p[:20]  # short


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(arrivals, ends), min_size=work_columns.COLUMNS_FROM, max_size=work_columns.COLUMNS_FROM + 10),
    st.data(),
)
def test_a_read_with_a_refused_record_loses_only_it_and_says_why(payloads: list[bytes], data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(payloads) - 1))
    payloads[at] = _bad(payloads[at], data.draw(st.integers(0, 5)))
    want_records, want_errors = one_by_one(payloads)
    records, errors = decode_work_records(payloads)
    assert list(records) == want_records
    assert [str(e) for e in errors] == want_errors


def test_texts_other_than_ascii_read_as_utf8() -> None:
    payloads = [encode_arrival(f"req-é-{i}", 1.0 + i, 10, 20, 1, True, None) for i in range(work_columns.COLUMNS_FROM)]
    payloads.append(encode_end("req-é-3", 9.0, 5, "ärger", None))
    records, errors = decode_work_records(payloads)
    assert type(records) is WorkColumns and not errors
    assert records[3] == WorkloadArrival("req-é-3", 4.0, 10, 20, 1, True, None)
    assert records[-1] == WorkloadEnd("req-é-3", 9.0, 5, "ärger", None)


def _export(log: WorkloadLog) -> dict[str, object]:
    return log.export(101.0, crashed=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 12), st.floats(0, 100), st.one_of(st.none(), st.integers(0, 9))),
        min_size=1,
        max_size=400,
    ),
    st.integers(1, 4),
)
def test_the_log_files_columns_as_it_files_records(events: list[tuple[bool, int, float, int | None]], reads: int) -> None:
    """Any order of arrivals and ends (ids reused, ends before their arrival, in one read or
    across reads): the log filed from columns exports what it does filed record by record."""
    payloads = [
        encode_end(f"r{i}", ts, n, "stop", n) if is_end else encode_arrival(f"r{i}", ts, n, 16, 1, False, None) for is_end, i, ts, n in events
    ]
    cut = max(1, len(payloads) // reads)
    by_columns, by_records = WorkloadLog(), WorkloadLog()
    for lo in range(0, len(payloads), cut):
        read = payloads[lo : lo + cut]
        records = [decode_work(p) for p in read]
        columns = work_columns._columns(read)
        assert columns is not None and list(columns) == records
        by_columns.add(WorkloadBatch("e", max(r.ts for r in records), columns))
        by_records.add(WorkloadBatch("e", max(r.ts for r in records), records))
    assert _export(by_columns) == _export(by_records)


def filed_as_columns(reads: list[list[bytes]]) -> dict[str, Any]:
    """The export's request columns of a log filed read by read as columns."""
    log = WorkloadLog()
    for read in reads:
        columns = work_columns._columns(read)
        assert columns is not None
        log.add(WorkloadBatch("e", 3.0, columns))
    cols: dict[str, Any] = log.export(101.0, crashed=False)["requests"]["columns"]
    return cols


def test_an_id_that_ends_then_arrives_again_in_one_read_is_filed_in_its_order() -> None:
    """The first request ``x`` ends and a second one arrives under its id in the same read: the
    end is the first's, the second stays in flight."""
    reads = [
        [encode_arrival("x", 1.0, 5, 16, 1, False, None)],
        [encode_end("x", 2.0, 3, "stop", None), encode_arrival("x", 3.0, 7, 16, 1, False, None)],
    ]
    cols = filed_as_columns(reads)
    assert cols["prompt_len"] == [5, 7] and cols["outcome"] == ["finished", "in_flight"]


def test_an_id_arriving_twice_in_one_read_meets_its_early_end_once() -> None:
    """An end read before its arrival closes the first arrival under its id, not a later one."""
    reads = [
        [encode_end("x", 2.0, 3, "stop", None)],
        [encode_arrival("x", 1.0, 5, 16, 1, False, None), encode_arrival("x", 3.0, 7, 16, 1, False, None)],
    ]
    cols = filed_as_columns(reads)
    assert cols["prompt_len"] == [5, 7] and cols["outcome"] == ["finished", "in_flight"]
