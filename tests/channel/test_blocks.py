from __future__ import annotations

from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.channel.blocks import RequestBlock, RequestRecords, decode_columns, pack_blocks, unpack_blocks
from collector.channel.codec import CodecError
from collector.channel.ringfile import RingReader, RingWriter
from tests.request_columns import Row, make_block


def _blocks() -> list[RequestBlock]:
    out: list[RequestBlock] = []
    for step in range(3):
        rows = [Row("cmpl-a-0", 100, 10 + step, step, 0, "running", 2, 5), Row("cmpl-b-0", 50, 5, 0, 1, "preempted", None, None)]
        out.append(make_block(step, float(step), rows, out[-1] if out else None))
    return out


@pytest.mark.parametrize("level", [0, 1])
def test_stored_blocks_read_back_to_the_same_columns_raw_or_compressed(level: int) -> None:
    blocks = _blocks()
    assert blocks[1].ids is blocks[0].ids  # a stable running set's ids are held once
    back = unpack_blocks(pack_blocks(blocks, level=level))
    assert decode_columns(back) == decode_columns(blocks)
    cols = decode_columns(back)
    assert cols["computed_tokens"] == [10, 5, 11, 5, 12, 5]
    assert cols["mirror_rows"] == [2, None] * 3 and cols["host_blocks"] == [5, None] * 3
    assert (blocks[0].running, blocks[0].mirror_rows, blocks[0].host_blocks) == (1, 2, 5)


def test_a_torn_or_foreign_blob_is_our_error() -> None:
    blob = pack_blocks(_blocks())
    for bad in (blob[:-3], b"FLRB0\n\x05\x00", b"not ours"):
        with pytest.raises(CodecError):
            unpack_blocks(bad)


def _ring_of(tmp_path: Path, payloads: list[bytes], capacity: int = 1 << 16) -> tuple[RingWriter, RingReader, list[memoryview], list[int]]:
    w = RingWriter(tmp_path / "r.ring", capacity=capacity)
    for p in payloads:
        w.append(p)
    r = RingReader(tmp_path / "r.ring")
    places: list[int] = []
    return w, r, r.read_views(places=places), places


def test_a_block_left_in_its_ring_reads_as_the_copied_one(tmp_path: Path) -> None:
    copied = _blocks()
    _, r, views, places = _ring_of(tmp_path, [b.payload() for b in copied])
    left = [RequestBlock.in_ring(v, r.records(), at) for v, at in zip(views, places, strict=True)]
    del views
    assert not left[0].held and copied[0].held
    for a, b in zip(left, copied, strict=True):
        assert (a.step, a.ts, a.n, a.flags, a.running, a.mirror_rows, a.host_blocks, a.nbytes) == (
            b.step,
            b.ts,
            b.n,
            b.flags,
            b.running,
            b.mirror_rows,
            b.host_blocks,
            b.nbytes,
        )
        assert a.parts() == (b.cols, b.ids)
    assert decode_columns(left) == decode_columns(copied)
    assert unpack_blocks(pack_blocks(left)) and decode_columns(unpack_blocks(pack_blocks(left))) == decode_columns(copied)
    held = left[2].resident()
    assert held is not None and held.held and held.payload() == copied[2].payload()


def test_a_block_its_ring_overwrote_is_left_out_of_the_rows_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    copied = _blocks()
    w, r, views, places = _ring_of(tmp_path, [b.payload() for b in copied], capacity=4096)
    left = [RequestBlock.in_ring(v, r.records(), at) for v, at in zip(views, places, strict=True)]
    del views
    for _ in range(100):  # the writer laps the ring: every block's bytes are overwritten
        w.append(b"x" * 300)
    assert left[0].parts() is None
    gone = left[0].resident()
    assert gone.gone and gone.held and gone.parts() is None
    assert (gone.running, gone.n, gone.mirror_rows) == (copied[0].running, copied[0].n, copied[0].mirror_rows)  # taken when read
    assert decode_columns(left)["step"] == []
    assert "overwritten in their ring" in caplog.text
    assert unpack_blocks(pack_blocks(left)) == []
    with pytest.raises(CodecError):
        gone.payload()
    from collector.snapshot.document import RequestTable

    table = RequestTable.from_blocks([gone, copied[1]])
    assert len(table) == copied[1].n and table.columns["step"] == [1] * copied[1].n


def _kept_ring(tmp_path: Path, steps: int = 40) -> tuple[Path, list[bytes]]:
    """A scheduler ring as the recorder writes it for a running set that holds ``steps`` steps:
    a full record, then records that keep its set (a full one again after KEPT_MAX); and the
    full record of every step, as a reader in order must see them."""
    from collector.channel.codec import encode_request_columns
    from collector.recorder import EngineIdentity, RequestRecorder

    rec = RequestRecorder(EngineIdentity(server_pid=1), directory=tmp_path, pid=1)
    ids, prompt, preempt, status = ["cmpl-a-0", "cmpl-b-0"], [100, 50], [0, 1], [0, 1]
    full = []
    for step in range(1, steps + 1):
        cols = {"prompt_len": prompt, "computed": [100 + step, 50], "output": [step, 0], "preemptions": preempt, "status": status}
        rec.write_requests(step, ts=float(step), n=2, ids=ids, mirror_rows=[2, -1], **cols)
        full.append(
            encode_request_columns(
                step,
                float(step),
                2,
                "\0".join(ids).encode(),
                *(array("I", cols[k]).tobytes() for k in cols if k != "status"),
                bytes(status),
                array("i", [2, -1]).tobytes(),
            )
        )
    return rec.channel.path, full


def test_records_that_keep_the_running_set_read_in_order_as_the_full_records(tmp_path: Path) -> None:
    from collector.channel.codec import FLAG_KEPT
    from collector.channel.reads import decode_read

    path, full = _kept_ring(tmp_path)
    r = RingReader(path)
    places: list[int] = []
    views = r.read_views(places=places)
    kept = [bool(v[21] & FLAG_KEPT) for v in views[1:]]
    assert kept[0] is False and kept[33] is False and sum(kept) == 38  # full at the 1st and the 34th
    requests = RequestRecords()
    read = decode_read(views, records=r.records, places=places, requests=requests)
    assert [b.payload() for b in read.blocks] == full  # left in the ring, each reads whole
    assert [(b.running, b.mirror_rows) for b in read.blocks] == [(1, 2)] * 40
    assert all(b.nbytes == read.blocks[0].nbytes for b in read.blocks)  # a kept record counts as the full one
    held = RequestBlock.resident_many(read.blocks)  # a capture's copies
    assert [b.payload() for b in held] == full and all(b.held for b in held)
    assert decode_columns(held) == decode_columns(unpack_blocks(pack_blocks(read.blocks)))
    assert requests.set_aside == 0


def test_a_reader_that_starts_inside_the_ring_or_lost_records_sets_kept_ones_aside(tmp_path: Path) -> None:
    from collector.channel.reads import decode_read

    path, full = _kept_ring(tmp_path)
    views = RingReader(path).read()
    requests = RequestRecords()
    late = decode_read(views[5:], requests=requests)  # started at the 5th step's record
    assert [b.step for b in late.blocks] == list(range(34, 41))  # from the next full record on
    assert requests.set_aside == 29 and not late.other  # steps 5 to 33
    requests.reset()  # records lost: the next kept ones wait for a full one
    with pytest.raises(CodecError):
        RequestBlock.from_payload(views[3])  # alone, a kept record cannot be read
    again = decode_read(views[36:], requests=requests)
    assert again.blocks == [] and requests.set_aside == 34  # steps 36 to 40 too


def test_a_kept_record_of_another_row_count_is_our_error(tmp_path: Path) -> None:
    from collector.channel.reads import decode_read

    _, full = _kept_ring(tmp_path, steps=2)
    views = RingReader(tmp_path / next(p.name for p in tmp_path.glob("*.ring"))).read()
    other = bytearray(views[2])
    other[17:21] = (3).to_bytes(4, "little")  # n = 3 against a set of 2
    read = decode_read([views[1], bytes(other)])
    assert len(read.blocks) == 1 and isinstance(read.other[0][2], CodecError)


def _two_sets_ring(tmp_path: Path, capacity: int = 1 << 16, steps: int = 8, every: int = 4) -> Path:
    """Full record of set A, kept ones, then set B (same row count), kept ones, and so on."""
    from collector.recorder import EngineIdentity, RequestRecorder

    rec = RequestRecorder(EngineIdentity(server_pid=1), directory=tmp_path, pid=1, capacity=capacity)
    for step in range(1, steps + 1):
        tag = "AB"[(step - 1) // every % 2]
        ids = [f"req-{tag}0-{(step - 1) // every}", f"req-{tag}1-{(step - 1) // every}"]
        rec.write_requests(
            step, ts=float(step), n=2, ids=ids, prompt_len=[7, 9], computed=[step, step], output=[0, 0], preemptions=[0, 0], status=[0, 0]
        )
    return rec.channel.path


def test_a_break_in_the_rings_records_drops_the_running_set_never_lends_it_to_the_next(tmp_path: Path) -> None:
    from collector.channel.reads import decode_read

    r = RingReader(_two_sets_ring(tmp_path))
    places: list[int] = []
    views = r.read_views(places=places)
    # the 5th step's record (set B's full one) skipped, as a corrupt record is: its kept ones
    # must not be read with set A's ids
    keep = [i for i in range(len(views)) if i != 5]
    requests = RequestRecords(capacity=1 << 16)
    read = decode_read([views[i] for i in keep], records=r.records, places=[places[i] for i in keep], requests=requests)
    got = {b.step: decode_columns([b])["request_id"] for b in read.blocks}
    assert sorted(got) == [1, 2, 3, 4] and requests.set_aside == 3
    assert all(ids[0].startswith("req-A0") for ids in got.values())


def test_a_lap_the_writer_padded_is_no_break(tmp_path: Path) -> None:
    from collector.channel.reads import decode_read

    path = _two_sets_ring(tmp_path, capacity=4096, steps=400, every=50)  # many laps, padded ends
    r = RingReader(path)
    requests = RequestRecords(capacity=4096)
    # the ring read once, from its tail: the first kept records wait for a full one, and no
    # other is set aside, across the laps the writer padded
    places: list[int] = []
    views = r.read_views(places=places)
    read = decode_read(views, records=r.records, places=places, requests=requests)
    seen = len(read.blocks)
    assert seen and all(decode_columns([b])["request_id"][0].endswith(str((b.step - 1) // 50)) for b in read.blocks)
    laps = [q for p, q in zip(places, places[1:], strict=False) if p // 4096 != q // 4096]
    assert laps and any(q % 4096 == 0 for q in laps)  # it read across laps, some of them padded
    from collector.channel.codec import FLAG_KEPT

    reqs = [v for v in views if v[:1] == b"R"]
    first_full = next(i for i, v in enumerate(reqs) if not v[21] & FLAG_KEPT)
    assert requests.set_aside == first_full  # only the kept records before the first full one


def test_a_running_set_is_read_from_its_ring_when_its_full_record_came_in_an_earlier_read(tmp_path: Path) -> None:
    from collector.channel.reads import decode_read

    path, full = _kept_ring(tmp_path)
    r = RingReader(path)
    requests = RequestRecords(capacity=1 << 16)
    blocks = []
    for n in (2, 5, 100):  # the first read ends right after the full record: the set comes from the ring
        places: list[int] = []
        views = r.read_views(n, places=places)
        blocks += decode_read(views, records=r.records, places=places, requests=requests).blocks
    assert [b.payload() for b in blocks] == full and requests.set_aside == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 200), st.sampled_from(["next", "next", "next", "gap", "lap"])), max_size=40),
    st.integers(0, 3),
)
def test_breaks_are_where_a_record_does_not_follow_the_last(records: list[tuple[int, str]], reads: int) -> None:
    """``breaks`` over reads of any split finds the records that follow a gap, and not those
    that follow a lap's padding: each record's place checked one by one against the last's end."""
    cap = 4096
    places, sizes, expected, want = [], [], -1, []
    for i, (size, how) in enumerate(records):
        place = 0 if expected < 0 else expected
        if how == "gap":
            place += 8 * (1 + size % 5)
        elif how == "lap":
            place = (place // cap + 1) * cap  # the writer padded the rest of the lap
        size_on_ring = (8 + size + 7) & ~7
        # the rule, record by record: a break unless it starts where the last ended, or at a
        # lap's start that the record did not fit before
        padded = place % cap == 0 and 0 < place - expected < size_on_ring
        if expected >= 0 and place != expected and not padded:
            want.append(i)
        places.append(place)
        sizes.append(size)
        expected = place + size_on_ring
    payloads = [b"x" * n for n in sizes]
    rr = RequestRecords(cap)
    got: list[int] = []
    cuts = sorted({len(records) * k // (reads + 1) for k in range(1, reads + 1)})
    for lo, hi in zip([0, *cuts], [*cuts, len(records)], strict=True):
        got += [lo + i for i in rr.breaks(places[lo:hi], payloads[lo:hi])]
    assert got == want
