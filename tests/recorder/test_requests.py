"""``RequestRecorder.write_encoded``, the scheduler's hot path, writes the very records
``write_requests`` writes, with the ring's CRC right, whichever columns it is handed again as the
same objects: a full record (``encode_request_columns``) when the running set changed or
``KEPT_MAX`` records kept it, else one with only the step's own columns, which a reader in ring
order turns back into that full record."""

from __future__ import annotations

import random
import zlib
from array import array
from pathlib import Path

from collector.channel.blocks import RequestRecords
from collector.channel.codec import FLAG_KEPT, KEPT_MAX, REQS_HEAD, encode_request_columns
from collector.channel.ringfile import HEADER_SIZE, REC, RingReader, _aligned
from collector.recorder import EngineIdentity, RequestRecorder


def raw_records(path: Path) -> list[tuple[int, int, bytes]]:
    """(length, crc, payload) of every record in a ring that never wrapped, read from the file."""
    data = path.read_bytes()
    head = int.from_bytes(data[24:32], "little")
    out, pos = [], 0
    while pos < head:
        length, crc = REC.unpack_from(data, HEADER_SIZE + pos)
        start = HEADER_SIZE + pos + REC.size
        out.append((length, crc, data[start : start + length]))
        pos += _aligned(REC.size + length)
    return out


def random_steps(seed: int, steps: int) -> list[tuple[object, ...]]:
    """Columns for ``steps`` steps as a scheduler hands them: a running set that holds for a few
    steps (its ids, prompts, preemptions and statuses the same objects meanwhile), computed and
    output new every step, host blocks reused until they change, mirror rows reused for runs of
    steps (as a decode step mirrors what the one before did) and new in others, so the columns
    the record ends with unchanged start at one place, then another."""
    rng = random.Random(seed)
    out: list[tuple[object, ...]] = []
    n = 0
    ids = prompt = preempt = status = host = b""
    mirror: bytes | None = None
    hisparse = seed % 2 == 1
    for step in range(1, steps + 1):
        if step == 1 or rng.random() < (0.25 if seed < 4 else 0.01):  # the running set changes (rarely: runs past KEPT_MAX)
            n = rng.choice([0, 1, 3, 17, 64])
            ids = "\0".join(f"cmpl-{rng.getrandbits(64):x}-0" for _ in range(n)).encode()
            prompt = array("I", [rng.randrange(1, 4000) for _ in range(n)]).tobytes()
            preempt = array("I", [rng.randrange(0, 3) for _ in range(n)]).tobytes()
            status = bytes(rng.randrange(0, 4) for _ in range(n))
            host = array("i", [rng.randrange(-1, 500) for _ in range(n)]).tobytes()
        if rng.random() < 0.3:  # host blocks moved
            host = array("i", [rng.randrange(-1, 500) for _ in range(n)]).tobytes()
        computed = array("I", [rng.randrange(0, 9000) for _ in range(n)]).tobytes()
        output = array("I", [rng.randrange(0, 2000) for _ in range(n)]).tobytes()
        if hisparse and (mirror is None or len(mirror) != 4 * n or rng.random() < 0.1):
            mirror = array("i", [rng.randrange(-1, 9) for _ in range(n)]).tobytes()
        out.append((step, 1000.0 + step / 100, n, ids, prompt, computed, output, preempt, status, mirror, host if hisparse else None))
    return out


def test_write_encoded_writes_the_records_write_requests_writes(tmp_path: Path) -> None:
    ident = EngineIdentity(server_pid=7, engine_version="0.32.0")
    for seed in range(6):
        fast = RequestRecorder(ident, directory=tmp_path / f"fast{seed}", pid=1, clock=lambda: 5.0)
        plain = RequestRecorder(ident, directory=tmp_path / f"plain{seed}", pid=1, clock=lambda: 5.0)
        steps = random_steps(seed, 240)
        for step, ts, n, ids, prompt, computed, output, preempt, status, mirror, host in steps:
            fast.write_encoded(step, ts, n, ids, prompt, computed, output, preempt, status, mirror, host)  # type: ignore[arg-type]
            plain.write_requests(
                step,  # type: ignore[arg-type]
                ts=ts,  # type: ignore[arg-type]
                n=n,  # type: ignore[arg-type]
                ids=ids,  # type: ignore[arg-type]
                prompt_len=prompt,  # type: ignore[arg-type]
                computed=computed,  # type: ignore[arg-type]
                output=output,  # type: ignore[arg-type]
                preemptions=preempt,  # type: ignore[arg-type]
                status=status,  # type: ignore[arg-type]
                mirror_rows=mirror,  # type: ignore[arg-type]
                host_blocks=host,  # type: ignore[arg-type]
            )
        assert fast.active and plain.active
        got, want = raw_records(fast.channel.path), raw_records(plain.channel.path)
        assert got == want  # length, CRC and payload of every record, the meta record's too
        # each record, read in order, is the full record of its step: a kept one with its set
        requests = RequestRecords()
        blocks = [requests.block(p) for _, _, p in got[1:]]
        assert [b.payload() for b in blocks if b is not None] == [encode_request_columns(*s) for s in steps]  # type: ignore[arg-type]
        kept = [bool(p[21] & FLAG_KEPT) for _, _, p in got[1:]]
        assert any(kept) and not kept[0]
        runs = "".join("k" if k else "." for k in kept).split(".")
        assert max(map(len, runs)) <= KEPT_MAX  # a full record at least every KEPT_MAX + 1
        if seed >= 4:
            assert max(map(len, runs)) == KEPT_MAX
        for (_, _, p), s, k in zip(got[1:], steps, kept, strict=True):
            own = 8 + 4 * (s[9] is not None) + 4 * (s[10] is not None)  # a kept record's bytes a row
            assert len(p) == (1 + REQS_HEAD.size + s[2] * own if k else len(encode_request_columns(*s)))  # type: ignore[arg-type,operator]
        assert all(crc == zlib.crc32(p) for _, crc, p in got)
        assert len(RingReader(fast.channel.path).read()) == len(steps) + 1  # the reader takes them all


def test_write_encoded_of_a_closed_or_failed_recorder_does_nothing(tmp_path: Path) -> None:
    rec = RequestRecorder(EngineIdentity(server_pid=7), directory=tmp_path)
    rec.channel.fail("test")
    rec.write_encoded(1, 1.0, 0, b"", b"", b"", b"", b"", b"")
    assert rec.failed == "test"


def test_a_column_that_is_not_bytes_disables_the_recorder_and_never_raises(tmp_path: Path) -> None:
    rec = RequestRecorder(EngineIdentity(server_pid=7), directory=tmp_path)
    rec.write_encoded(1, 1.0, 1, b"a", [5], b"\0" * 4, b"\0" * 4, b"\0" * 4, b"\0")  # type: ignore[arg-type]
    assert not rec.active and rec.failed is not None and "write_requests" in rec.failed
