"""The ring file: what a reader gets back whatever the writer did (wrapped, lapped the reader,
was SIGKILLed mid-stream) and whatever happened to the bytes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.channel.ringfile import HEADER_SIZE, REC, RingCorrupt, RingReader, RingWriter, reader_crc32

SEQ = struct.Struct("<Q")


def rec(i: int, size: int = 0) -> bytes:
    return SEQ.pack(i) + bytes([i % 251]) * size


def seqs(payloads: list[bytes]) -> list[int]:
    return [SEQ.unpack_from(p)[0] for p in payloads]


def test_reader_gets_records_in_order(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=4096)
    for i in range(10):
        w.append(rec(i, i))
    r = RingReader(tmp_path / "a.ring")
    got = r.read()
    assert seqs(got) == list(range(10))
    assert got[7] == rec(7, 7)
    assert r.read() == []  # nothing new


def test_wrap_around_with_a_reader_that_keeps_up(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=4096)
    r = RingReader(tmp_path / "a.ring")
    got: list[bytes] = []
    for i in range(2000):  # about 40 times the capacity, sizes crossing the wrap point
        w.append(rec(i, (i * 37) % 300))
        if i % 5 == 4:
            got.extend(r.read())
    got.extend(r.read())
    assert seqs(got) == list(range(2000))
    assert r.lost_bytes == 0 and r.corrupt_records == 0
    assert w.head > 10 * 4096


def test_lapped_reader_gets_a_contiguous_newest_suffix(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=4096)
    r = RingReader(tmp_path / "a.ring")
    for i in range(1000):
        w.append(rec(i, 50))
    got = seqs(r.read())
    assert got[-1] == 999
    assert got == list(range(got[0], 1000))
    assert got[0] > 0 and r.lost_bytes > 0
    # everything that fits is still there (the ring holds whole records only)
    size = (REC.size + SEQ.size + 50 + 7) & ~7
    assert len(got) >= 4096 // size - 1


def test_corrupt_payload_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "a.ring"
    w = RingWriter(path, capacity=4096)
    for i in range(5):
        w.append(rec(i, 16))
    w.close()
    record_size = (REC.size + 8 + 16 + 7) & ~7
    with open(path, "r+b") as f:  # flip one byte inside record 2's payload
        f.seek(HEADER_SIZE + 2 * record_size + REC.size + 10)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    r = RingReader(path)
    assert seqs(r.read()) == [0, 1, 3, 4]
    assert r.corrupt_records == 1


def test_impossible_length_resyncs(tmp_path: Path) -> None:
    path = tmp_path / "a.ring"
    w = RingWriter(path, capacity=4096)
    for i in range(3):
        w.append(rec(i, 16))
    with open(path, "r+b") as f:  # record 0's length field now points past the area
        f.seek(HEADER_SIZE)
        f.write(struct.pack("<I", 100_000))
    r = RingReader(path)
    assert r.read() == []  # the stretch after a bad header cannot be trusted
    assert r.corrupt_records == 1
    w.append(rec(3, 16))
    assert seqs(r.read()) == [3]  # and reading goes on with what comes next


def test_not_a_ring_file(tmp_path: Path) -> None:
    path = tmp_path / "x.ring"
    path.write_bytes(b"hello" * 100)
    with pytest.raises(RingCorrupt):
        RingReader(path)


def test_restarted_reader_rereads_what_the_ring_holds(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=8192)
    for i in range(300):
        w.append(rec(i, 20))
    first = RingReader(tmp_path / "a.ring").read()
    second = RingReader(tmp_path / "a.ring").read()
    assert first == second and seqs(first)[-1] == 299
    w.append(rec(300, 20))
    third = RingReader(tmp_path / "a.ring").read()
    assert seqs(third)[-1] == 300


def test_record_too_large_is_refused(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=4096)
    with pytest.raises(ValueError):
        w.append(b"x" * 3000)


def _write_forever(path: str) -> None:
    w = RingWriter(path, capacity=1 << 20)
    i = 0
    while True:
        w.append(rec(i, i % 200))
        i += 1


def test_sigkilled_writer_loses_nothing_it_published(tmp_path: Path) -> None:
    path = tmp_path / "w.ring"
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_write_forever, args=(str(path),), daemon=True)
    child.start()
    try:
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        live = RingReader(path)
        seen: list[bytes] = []
        while len(seen) < 2000 and time.monotonic() < deadline:
            seen.extend(live.read())
        # Stopped first, killed after: between the live reader's last read and the kill the
        # writer publishes nothing more, so a loaded machine cannot let it lap the ring there
        # (what this test checks is what a SIGKILL does to what was published, not the race).
        assert child.pid is not None
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.05)
        seen.extend(live.read())
    finally:
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    after = RingReader(path)
    got = after.read()
    numbers = seqs(got)
    assert after.corrupt_records == 0
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # no gap
    assert numbers[-1] >= seqs(seen)[-1]  # everything the live reader saw, and maybe more
    assert set(seqs(seen[-50:])) <= set(numbers)  # the last records seen are still there
    assert got[-1] == rec(numbers[-1], numbers[-1] % 200)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 900), min_size=1, max_size=300),
    read_every=st.integers(1, 40),
)
def test_any_interleaving_yields_ordered_contiguous_runs(tmp_path_factory: pytest.TempPathFactory, sizes: list[int], read_every: int) -> None:
    path = tmp_path_factory.mktemp("ring") / "p.ring"
    w = RingWriter(path, capacity=4096)
    r = RingReader(path)
    got: list[bytes] = []
    for i, size in enumerate(sizes):
        w.append(rec(i, size))
        if i % read_every == 0:
            got.extend(r.read())
    got.extend(r.read())
    numbers = seqs(got)
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert numbers[-1] == len(sizes) - 1
    for p in got:  # every record comes back whole
        i = SEQ.unpack_from(p)[0]
        assert p == rec(i, sizes[i])
    if r.lost_bytes == 0:
        assert numbers == list(range(len(sizes)))


def _truncate_while_mapped(path: str, size: int) -> None:
    reader = RingReader(path)
    with open(path, "r+b") as f:
        f.truncate(size)
    try:
        reader.read()
    except RingCorrupt:
        os._exit(3)  # the reader's own error: what the sidecar counts and goes on from
    os._exit(0)


@pytest.mark.parametrize("size", [HEADER_SIZE + 100, 10, 0])
def test_ring_truncated_under_the_reader_is_an_error_not_sigbus(tmp_path: Path, size: int) -> None:
    path = tmp_path / "t.ring"
    w = RingWriter(path, capacity=1 << 16)
    for i in range(500):
        w.append(rec(i, 100))
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_truncate_while_mapped, args=(str(path), size))
    child.start()
    child.join(30)
    assert child.exitcode == 3, f"reader ended with {child.exitcode} (-7 is SIGBUS)"


def _open_fifo(path: str) -> None:
    try:
        RingReader(path)
    except RingCorrupt as exc:
        os._exit(3 if "not a regular file" in str(exc) else 4)
    os._exit(0)


def test_fifo_named_ring_does_not_hang_open(tmp_path: Path) -> None:
    fifo = tmp_path / "decode-0.stats.1.ring"
    os.mkfifo(fifo)
    child = multiprocessing.get_context("fork").Process(target=_open_fifo, args=(str(fifo),))
    child.start()
    child.join(10)  # in a child: a regression hangs it, not the test run
    if child.exitcode is None:
        child.kill()
        child.join()
    assert child.exitcode == 3


def test_symlinked_ring_is_not_followed(tmp_path: Path) -> None:
    RingWriter(tmp_path / "real.ring", capacity=4096).append(rec(1))
    (tmp_path / "link.ring").symlink_to(tmp_path / "real.ring")
    with pytest.raises(RingCorrupt, match="symlink"):
        RingReader(tmp_path / "link.ring")


def test_writer_does_not_follow_a_planted_tmp_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "e.ring.tmp").symlink_to(victim)
    w = RingWriter(tmp_path / "e.ring", capacity=4096)
    w.append(rec(1))
    assert victim.read_text() == "precious"
    assert not (tmp_path / "e.ring").is_symlink()
    assert seqs(RingReader(tmp_path / "e.ring").read()) == [1]


def test_ring_files_are_owner_only(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        RingWriter(tmp_path / "e.ring", capacity=4096)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "e.ring").st_mode & 0o777 == 0o600


def test_reader_refuses_a_ring_of_another_user(tmp_path: Path) -> None:
    RingWriter(tmp_path / "e.ring", capacity=4096)
    path = tmp_path / "e.ring"
    if os.geteuid() == 0:  # root is trusted: make the file another user's
        os.chown(path, 54321, 54321)
        kwargs: dict[str, int] = {}
    else:
        kwargs = {"owner": 54321}
    with pytest.raises(RingCorrupt, match="owned by uid"):
        RingReader(path, **kwargs)


def test_record_longer_than_one_copy(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "big.ring", capacity=8 << 20)
    r = RingReader(tmp_path / "big.ring")
    for i in range(6):  # 3 MiB records: longer than the reader's 1 MiB copy
        w.append(rec(i, 3 << 20))
        assert seqs(r.read()) == [i]
    assert r.corrupt_records == 0


def test_views_of_a_read_are_the_records_as_read_copies_them(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "v.ring", capacity=4096)
    for i in range(5):
        w.append(rec(i, i * 7))
    views = RingReader(tmp_path / "v.ring").read_views()
    assert all(isinstance(v, memoryview) for v in views)
    assert [v.tobytes() for v in views] == [rec(i, i * 7) for i in range(5)]


def test_a_record_is_read_again_at_its_place_until_the_writer_overwrites_it(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=4096)
    r = RingReader(tmp_path / "a.ring")
    for i in range(5):
        w.append(rec(i, 100))
    places: list[int] = []
    got = r.read_views(places=places)
    assert len(places) == len(got) == 5
    records = r.records()
    assert [records.payload(at, len(p)) for at, p in zip(places, got, strict=True)] == [bytes(p) for p in got]
    assert records.payload(places[1], len(got[1]) + 1) is None  # not the length its header says
    r.close()  # the reader's own descriptor: the records hold one of their own
    assert records.payload(places[4], len(got[4])) == rec(4, 100)
    for i in range(5, 200):  # laps the ring many times over
        w.append(rec(i, 100))
    assert records.payload(places[0], len(got[0])) is None
    assert records.payload(places[4], len(got[4])) is None


def test_a_record_read_again_from_a_truncated_ring_is_gone_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.ring"
    w = RingWriter(path, capacity=4096)
    w.append(rec(1, 2000))
    r = RingReader(path)
    places: list[int] = []
    (one,) = r.read_views(places=places)
    records = r.records()
    os.truncate(path, HEADER_SIZE + 100)
    assert records.payload(places[0], len(one)) is None


def test_a_closed_readers_records_are_handed_over_or_refused(tmp_path: Path) -> None:
    w = RingWriter(tmp_path / "a.ring", capacity=4096)
    w.append(rec(1, 10))
    r = RingReader(tmp_path / "a.ring")
    places: list[int] = []
    (one,) = r.read_views(places=places)
    records = r.records()
    assert r.release() is records  # the reader closed, its records still readable
    assert records.payload(places[0], len(one)) == rec(1, 10)
    records.close()
    assert records.payload(places[0], len(one)) is None
    with pytest.raises(OSError):
        r.records()  # a closed reader lends no more


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=700), min_size=5, max_size=60), st.integers(min_value=0, max_value=40))
def test_records_read_again_in_stretches_are_those_read_one_by_one(tmp_path_factory: pytest.TempPathFactory, sizes: list[int], more: int) -> None:
    """``payloads`` (one pread per stretch of the file) gives what ``payload`` gives each: across
    the wrap, for places the writer has since overwritten, and for a wrong length."""
    path = tmp_path_factory.mktemp("r") / "a.ring"
    w = RingWriter(path, capacity=8192)
    r = RingReader(path)
    places: list[int] = []
    got: list[memoryview] = []
    for i, size in enumerate(sizes):
        w.append(rec(i, size))
        got += r.read_views(places=places)
    for i in range(more):  # the writer goes on: the oldest are overwritten
        w.append(rec(1000 + i, 300))
    wanted = [(at, len(p)) for at, p in zip(places, got, strict=True)]
    wanted.append((places[-1], len(got[-1]) + 8))  # not the length its header says
    records = r.records()
    assert records.payloads(wanted) == [records.payload(at, n) for at, n in wanted]
    assert records.payloads(wanted[::-1]) == [records.payload(at, n) for at, n in wanted[::-1]]


@given(st.binary(max_size=40_000), st.integers(0, 64))
def test_the_readers_crc_is_zlibs_number_on_bytes_and_on_views(data: bytes, cut: int) -> None:
    import zlib

    check = reader_crc32()
    assert check(data) == zlib.crc32(data)
    assert check(memoryview(data)[cut:]) == zlib.crc32(data[cut:])


def test_the_writer_side_keeps_to_the_standard_library(tmp_path: Path) -> None:
    # inside vLLM only the writer runs: writing a ring imports no checksum library of the reader's
    script = (
        "import sys\n"
        "from collector.channel.ringfile import RingWriter\n"
        f"w = RingWriter({str(tmp_path / 'w.ring')!r}, capacity=1 << 16)\n"
        "w.append(b'S' * 90)\n"
        "w.close()\n"
        "print('isal' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]
