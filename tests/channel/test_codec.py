"""Record payloads: every record the recorder writes decodes to the observation it describes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.channel.codec import (
    STATUSES,
    WORK_HEAD,
    WORK_ID_MAX,
    CodecError,
    decode,
    decode_many,
    decode_work,
    encode,
    encode_arrival,
    encode_end,
    encode_event,
    encode_fingerprint,
    encode_step,
    encode_step_fields,
)
from collector.model import HALF_REQUESTS, Event, EventKind, Fingerprint, Severity, StepRecord, WorkloadArrival, WorkloadBatch, WorkloadEnd
from tests.request_columns import Row, encode_rows, rows_of


def test_binary_step_round_trip_without_extras() -> None:
    payload = encode_step_fields(812, 1.5e9, 1, 4, 7, 2, 0.032, 1, 300, 16, 2, 640, 128)
    assert payload[:1] == b"S" and len(payload) < 80  # no JSON on the common path
    meta, step = decode(payload, engine="decode-0")
    assert meta is None and isinstance(step, StepRecord)
    assert (step.engine, step.step, step.ts, step.engine_index) == ("decode-0", 812, 1.5e9, 1)
    assert (step.running, step.waiting, step.preemptions) == (4, 7, 1)
    assert step.kv_cache_usage == pytest.approx(0.032)
    assert (step.prompt_tokens, step.generation_tokens, step.finished) == (300, 16, 2)
    assert (step.prefix_cache_queries, step.prefix_cache_hits) == (640, 128)
    assert step.waiting_by_reason == {"capacity": 5, "deferred": 2}
    assert step.request_block is None and step.connector == {} and step.finished_requests == []


def test_step_record_round_trip_with_extras() -> None:
    rec = StepRecord(
        engine="d",
        ts=12.25,
        step=9,
        running=3,
        waiting=2,
        kv_cache_usage=0.5,
        preemptions=2,
        prompt_tokens=10,
        generation_tokens=3,
        finished=1,
        waiting_by_reason={"capacity": 1, "deferred": 1, "kv_fetch_in_progress": 4},
        prefix_cache_queries=5,
        prefix_cache_hits=4,
        connector={"Nixl.num_failed": 1, "mirror_rows": 12},
        engine_index=2,
        worker="Worker_TP1",
    )
    _, back = decode(encode_step(rec), engine="d")
    assert back == rec
    assert back.mirror_rows == 12


def _decoded(raw: bytes, engine: str = "d") -> StepRecord:
    _, step = decode(raw, engine=engine)
    assert isinstance(step, StepRecord) and step.halves == HALF_REQUESTS
    return step


def test_request_rows_round_trip_with_and_without_the_optional_columns() -> None:
    rows = [
        Row("cmpl-a-0", 32000, 32512, 512, 0, "running", 8, 500),
        Row("cmpl-é-1", 300, 0, 0, 2, "preempted", None, None),
        Row("x", 5, 5, 1, 0, "waiting_for_remote_kvs", 0, 3),
    ]
    step = _decoded(encode_rows(77, 3.5, rows), "decode-0")
    assert rows_of(step.request_block) == rows
    assert (step.engine, step.step, step.ts, step.running) == ("decode-0", 77, 3.5, 1)
    plain = [Row("a", 1, 2, 3, 4), Row("b", 5, 6)]
    assert rows_of(_decoded(encode_rows(1, 0.0, plain)).request_block) == plain
    empty = _decoded(encode_rows(2, 0.0, []))
    assert rows_of(empty.request_block) == [] and empty.running == 0


def test_unknown_status_survives_as_unknown() -> None:
    step = _decoded(encode_rows(1, 0.0, [Row("a", 1, 1, status="made_up")]))
    assert rows_of(step.request_block)[0].status == "unknown"


@given(
    st.lists(
        st.builds(
            Row,
            request_id=st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40),
            prompt_len=st.integers(0, 2**32 - 1),
            computed_tokens=st.integers(0, 2**32 - 1),
            output_tokens=st.integers(0, 2**32 - 1),
            preemptions=st.integers(0, 2**32 - 1),
            status=st.sampled_from(STATUSES),
            mirror_rows=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
            host_blocks=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
        ),
        max_size=40,
    ),
    st.integers(0, 2**63),
)
def test_request_rows_round_trip_property(rows: list[Row], step: int) -> None:
    back = _decoded(encode_rows(step, 1.0, rows))
    assert rows_of(back.request_block) == rows and back.step == step


def test_json_records_decode() -> None:
    meta, obs = decode(encode({"t": "meta", "engine": "e", "role": "stats", "pid": 3}))
    assert obs is None and meta == {"t": "meta", "engine": "e", "role": "stats", "pid": 3}
    fp = Fingerprint(engine="e", ts=1.0, facts={"block_size": 64, "env": {"NCCL_NET_PLUGIN": "x"}})
    assert decode(encode_fingerprint(fp))[1] == fp
    ev = Event(
        kind=EventKind.CUDA_ERROR,
        ts=3.0,
        source="recorder",
        message="boom",
        severity=Severity.CRITICAL,
        engine="e",
        frames=[{"file": "a.py", "line": 1}],
    )
    assert decode(encode_event(ev))[1] == ev


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"Z{}",
        b"J[1,2]",
        b"J{not json",
        b'J{"t":"nope"}',
        b'J{"t":"step","engine":"e"}',
        b"S\x01\x02",
        encode_step_fields(1, 0.0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0) + b"[1]",
        encode_rows(1, 0.0, [Row("a", 1, 1), Row("b", 1, 1)])[:-12],
        encode_rows(1, 0.0, []) + b"a",
    ],
)
def test_malformed_payloads_raise_codec_error(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode(payload)
    assert decode_many([memoryview(payload)])[0][2] is not None  # a view of a ring read: the same


@pytest.mark.parametrize(
    "payload",
    [
        encode_rows(7, 0.0, [Row("a", 1, 1), Row("b", 1, 1)])[:-3],  # no ids for two rows
        encode_rows(7, 0.0, [Row("a", 1, 1)]) + b"\0extra",  # two ids for one row
    ],
)
def test_request_ids_that_do_not_match_the_rows_are_null_when_read(payload: bytes, caplog: pytest.LogCaptureFixture) -> None:
    # Counting the ids of every step's record cost more than its CRC; they are counted when the
    # rows are decoded (a snapshot read), and a block whose ids do not match says so there.
    step = _decoded(payload, "decode-0")
    block = step.request_block
    assert block is not None
    with caplog.at_level("WARNING"):
        cols = block.column("request_id"), block.column("prompt_len")
    assert cols == ([None] * block.n, [1] * block.n)
    assert "ids do not match their rows (steps [7])" in caplog.text


def test_request_records_reach_ingest_as_blocks_without_row_objects() -> None:
    rows = [Row("cmpl-a-0", 32000, 32512, 512, 0, "running", 7), Row("cmpl-b-0", 100, 5, 1, 2, "preempted", None)]
    step = _decoded(encode_rows(77, 3.5, rows), "decode-0")
    block = step.request_block
    assert block is not None
    assert (block.step, block.n, block.running, block.mirror_rows) == (77, 2, 1, 7)
    assert step.running == 1 and step.kv_cache_usage is None  # the stats half is unknown, not 0
    assert block.column("request_id") == ["cmpl-a-0", "cmpl-b-0"]
    assert block.column("mirror_rows") == [7, None]
    assert block.column("status") == ["running", "preempted"]


_EVENT = {"t": "ev", "engine": "e", "kind": "cuda_error", "ts": 3.0, "source": "recorder", "message": "boom", "severity": "critical"}


@pytest.mark.parametrize(
    "body",
    [
        {"t": "step", "engine": "e", "step": 5, "ts": 2.0, "running": 3},
        {"t": "req", "engine": "e", "step": 4, "ts": 1.0, "cols": ["id", "prompt_len", "computed"], "rows": [["r", 10, 11]]},
        {"t": "wl", "ev": "arrive", "id": "cmpl-1", "ts": 1.0, "prompt_len": 32000},  # a format 2 recorder's
    ],
)
def test_steps_travel_only_as_binary_records(body: dict) -> None:
    # the JSON forms of S and R records were a 0.1 recorder's; nothing writes them
    with pytest.raises(CodecError, match="unknown record type"):
        decode(encode(body))


# Each record decodes with the good value and is a CodecError with the bad one: the value would
# otherwise reach a typed column (a string xid made /api/v1/events answer 500; a step of 2**70
# or kv_cache_usage "abc" stopped the batching writer).
@pytest.mark.parametrize(
    ("base", "key", "good", "bad"),
    [
        (_EVENT, "xid", 43, "43"),
        (_EVENT, "xid", 43, True),
        (_EVENT, "xid", 43, 2**40),
        (_EVENT, "xid", 43, -1),
        (_EVENT, "pid", 415, 415.5),
        (_EVENT, "pid", 415, "415"),
        (_EVENT, "pid", 415, [415]),
        (_EVENT, "gpu", "0000:00:06.0", 6),
        (_EVENT, "gpu", "0000:00:06.0", "g" * 129),
        (_EVENT, "gpu", "0000:00:06.0", "a\x00b"),
        (_EVENT, "process", "Worker_TP1", {"a": 1}),
        (_EVENT, "ts", 3.0, "now"),
        (_EVENT, "ts", 3.0, float("nan")),
        (_EVENT, "message", "boom", 7),
        (_EVENT, "frames", [{"file": "a.py"}], ["a.py"]),
        (_EVENT, "lines", ["x"], [1]),
        (_EVENT, "data", {"k": 1}, [1]),
        (_EVENT, "kind", "cuda_error", 3),
    ],
)
def test_wrong_typed_json_fields_are_codec_errors(base: dict, key: str, good: object, bad: object) -> None:
    _, obs = decode(encode({**base, key: good}))
    assert obs is not None
    with pytest.raises(CodecError):
        decode(encode({**base, key: bad}))


@given(
    st.dictionaries(
        st.sampled_from(
            ["t", "engine", "kind", "ts", "xid", "pid", "gpu", "step", "running", "kv_cache_usage", "rows", "cols", "facts", "data", "lines"]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=5),
            st.lists(st.integers(), max_size=3),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        ),
    ).map(lambda d: {**d, "t": d.get("t") if d.get("t") is not None else "ev"})
)
def test_any_json_record_decodes_typed_or_raises_codec_error(body: dict) -> None:
    for t in ("ev", "fp", "wl"):
        try:
            _, obs = decode(encode({**body, "t": t}))
        except CodecError:
            continue
        if isinstance(obs, Event):
            assert obs.xid is None or type(obs.xid) is int
            assert obs.pid is None or type(obs.pid) is int
            assert obs.gpu is None or isinstance(obs.gpu, str)


@pytest.mark.parametrize(
    "payload",
    [b"J" + b"[" * 100_000, b'J{"t":"ev","data":' + b"[" * 100_000, encode_step_fields(1, 0.0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0) + b"[" * 100_000],
)
def test_deeply_nested_json_is_a_codec_error(payload: bytes) -> None:
    # found by scripts/fuzz.py: json.loads raised RecursionError through decode
    with pytest.raises(CodecError):
        decode(payload)


def test_a_read_decoded_together_is_what_each_record_decodes_to_alone_in_the_same_order() -> None:
    plain = [encode_step_fields(n, 10.0 + n, 1, 8, 3, 1, 0.25, 0, 64, 8, 0, 100, 40) for n in range(5)]
    with_nulls = encode_step_fields(5, 15.0, 1, 8, None, None, None, 0, 64, 8, 0, None, None)
    with_extras = encode_step_fields(6, 16.0, 1, 8, 3, 1, 0.5, 0, 64, 8, 1, 100, 40, {"connector": {"X.pending": 2}})
    reqs = encode_rows(6, 16.0, [Row("r1", 10, 5)])
    payloads = [
        plain[0],
        encode({"t": "meta", "engine": "d", "role": "stats"}),
        plain[1],
        b"Xbad",
        with_nulls,
        plain[2],
        with_extras,
        reqs,
        plain[3],
        b"S short",
        plain[4],
    ]
    out = decode_many(payloads)
    assert len(out) == len(payloads)
    for payload, (meta, obs, error) in zip(payloads, out, strict=True):
        if payload in (b"Xbad", b"S short"):
            assert meta is None and obs is None and isinstance(error, CodecError)
            continue
        alone_meta, alone_obs = decode(payload)
        assert error is None and meta == alone_meta
        assert obs == alone_obs and (obs is None or obs.halves == alone_obs.halves)  # type: ignore[union-attr]
    steps = [obs for _, obs, _ in out if isinstance(obs, StepRecord) and obs.request_block is None]
    assert [s.step for s in steps] == [0, 1, 5, 2, 6, 3, 4]  # arrival order, plain or not
    assert steps[2].waiting is None and steps[2].kv_cache_usage is None and steps[2].prefix_cache_hits is None  # unknown, not 0
    assert steps[0].waiting_by_reason == {"capacity": 2, "deferred": 1} and steps[0].kv_cache_usage == 0.25


# -- W: the workload records ---------------------------------------------------------------------
_counts = st.one_of(st.none(), st.integers(0, 2**63 - 1))
_flags = st.one_of(st.none(), st.booleans())
_ids = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1, max_size=60)


@given(_ids, st.floats(0, 2e9), _counts, _counts, _counts, _flags, _flags)
def test_an_arrival_round_trips_with_unknowns_as_none(
    rid: str, ts: float, prompt: int | None, mx: int | None, n: int | None, eos: bool | None, stop: bool | None
) -> None:
    _, batch = decode(encode_arrival(rid, ts, prompt, mx, n, eos, stop), engine="decode-0")
    assert isinstance(batch, WorkloadBatch) and batch.engine == "decode-0" and batch.ts == ts
    assert batch.records == [WorkloadArrival(rid, ts, prompt, mx, n, eos, stop)]


@given(
    _ids,
    st.floats(0, 2e9),
    _counts,
    st.one_of(st.none(), st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=16)),
    _counts,
)
def test_an_end_round_trips_with_unknowns_as_none(rid: str, ts: float, out: int | None, finish: str | None, cached: int | None) -> None:
    assert decode_work(encode_end(rid, ts, out, finish, cached)) == WorkloadEnd(rid, ts, out, finish, cached)


def test_counts_a_record_cannot_hold_are_written_as_unknown_and_ids_are_made_fit() -> None:
    got = decode_work(encode_arrival("a\0b", 1.0, -1, 1 << 64, True, None, False))  # type: ignore[arg-type]
    assert got == WorkloadArrival("ab", 1.0, None, None, None, None, False)  # True is not a count
    long = "é" * WORK_ID_MAX  # 2 bytes each: cut to whole characters within the limit
    got_end = decode_work(encode_end(long, 2.0, 0, "x" * 100, 0))
    assert isinstance(got_end, WorkloadEnd) and got_end.request_id == "é" * (WORK_ID_MAX // 2) and got_end.finish == "x" * 64
    assert got_end.output_len == 0 and got_end.cached_tokens == 0  # a measured 0 stays 0


def _work(
    event: int = 0,
    nulls: int = 0,
    flags: int = 0,
    id_len: int | None = None,
    ts: float = 1.0,
    counts: tuple[int, int, int] = (1, 2, 3),
    rid: bytes = b"cmpl-1",
    rest: bytes = b"",
) -> bytes:
    return b"W" + WORK_HEAD.pack(event, nulls, flags, len(rid) if id_len is None else id_len, ts, *counts) + rid + rest


@pytest.mark.parametrize(
    "payload",
    [
        b"W",
        _work()[:-1],  # truncated id
        _work()[:20],  # truncated head
        _work(rest=b"x"),  # an arrival with bytes after its id
        _work(id_len=7),  # longer than the bytes there
        _work(id_len=0, rid=b""),  # no id
        _work(id_len=0xFFFF),  # a huge length
        _work(id_len=WORK_ID_MAX + 1, rid=b"a" * (WORK_ID_MAX + 1)),
        _work(rid=b"cmpl\x001"),  # NUL in the id
        _work(rid=b"\xff\xfe"),  # not UTF-8
        _work(event=1, counts=(1, 2, 0), rest=b"len\x00gth"),  # NUL in the finish reason
        _work(event=1, counts=(1, 2, 0), rest=b"x" * 65),  # a finish reason too long
        _work(event=2),  # no such event
        _work(nulls=0x20),  # a null bit no field has
        _work(flags=4),  # a flag no field has
        _work(event=1, flags=1, counts=(1, 2, 0)),  # an end has no flags
        _work(event=1, counts=(1, 2, 3)),  # an end's third slot is unused
        _work(nulls=1),  # unknown, yet a value in its slot
        _work(nulls=8, flags=1),
        _work(event=1, nulls=8, counts=(1, 2, 0), rest=b"length"),  # unknown finish, yet one there
        _work(counts=(-1, 2, 3)),  # a negative count
        _work(ts=float("nan")),
        _work(ts=-1.0),
    ],
)
def test_hostile_workload_records_are_codec_errors(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode(payload)
    ((meta, obs, error),) = decode_many([payload])
    assert meta is None and obs is None and isinstance(error, CodecError)


def test_a_reads_workload_records_are_one_batch_in_order_at_the_first_ones_place() -> None:
    a = encode_arrival("a", 1.0, 10, 5, 1, True, False)
    b = encode_arrival("b", 3.0, 20, None, 1, None, None)
    e = encode_end("a", 2.0, 5, "length", None)
    step = encode_step_fields(1, 1.5, 0, 8, 3, 1, 0.25, 0, 64, 8, 0, 100, 40)
    out = decode_many([step, a, b"W short", e, step, b], engine="d")
    assert [type(obs).__name__ if obs else type(err).__name__ for _, obs, err in out] == ["StepRecord", "WorkloadBatch", "CodecError", "StepRecord"]
    batch = out[1][1]
    assert isinstance(batch, WorkloadBatch) and batch.engine == "d" and batch.ts == 3.0  # the newest record's time
    assert batch.records == [decode_work(a), decode_work(e), decode_work(b)]


def test_a_request_block_from_a_view_of_a_read_holds_its_own_bytes_not_the_read() -> None:
    # A ring read's copy is up to 1 MiB: a block that kept a view of it would pin it for as long
    # as the engine's ring holds the step.
    rows = [Row("cmpl-a-0", 3, 4, 5, 0, "running", 7), Row("cmpl-b-0", 1, 2, 3, 0, "preempted", None)]
    payload = encode_rows(5, 1.5, rows)
    read = memoryview(b"\0" * 64 + payload + b"\0" * 64)
    [(_, obs, error)] = decode_many([read[64 : 64 + len(payload)]], engine="decode-0")
    assert error is None and isinstance(obs, StepRecord) and obs.request_block is not None
    block = obs.request_block
    assert type(block.cols) is bytes and type(block.ids) is bytes
    assert block.payload() == payload and block.column("request_id") == ["cmpl-a-0", "cmpl-b-0"]
