"""Trigger intents: written whole or not at all, owner-only, and anything torn or foreign refused."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from collector.model import Event, EventKind, Severity
from collector.snapshot import intent


def xid_event() -> Event:
    return Event(
        kind=EventKind.XID,
        ts=time.time(),
        source="kmsg",
        severity=Severity.CRITICAL,
        xid=79,
        pid=3107,
        gpu="0000:18:00.0",
        message="NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        data={"seq": 12},
        uid="0123456789abcdef0123456789abcdef",
    )


def test_an_intent_reads_back_as_the_event_it_was_written_with(tmp_path: Path) -> None:
    ev = xid_event()
    path = intent.write(tmp_path / "spool", "decode-0", ev, accepted_at=ev.ts + 0.001)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "spool").st_mode) == 0o700
    assert intent.pending(tmp_path / "spool") == [path]
    assert not list((tmp_path / "spool").glob(".*.tmp"))
    it = intent.read(path)
    assert it.engine == "decode-0" and it.accepted_at == pytest.approx(ev.ts + 0.001)
    assert it.event.to_dict() == ev.to_dict()


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # torn
        lambda b: b.replace(b"fallen", b"FALLEN"),  # a flipped byte: the checksum
        lambda b: b"FLSPOOL2\n" + b[len(intent.MAGIC) :],  # another file's magic
        lambda b: b"",  # empty
        lambda b: b"\x00" * 300,
    ],
    ids=["torn", "flipped", "foreign", "empty", "zeros"],
)
def test_a_damaged_intent_is_an_intent_error(tmp_path: Path, damage: object) -> None:
    path = intent.write(tmp_path, "decode-0", xid_event(), accepted_at=1.0)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(intent.IntentError):
        intent.read(path)


def test_an_intent_without_an_event_id_is_refused(tmp_path: Path) -> None:
    ev = xid_event()
    ev.uid = ""
    path = tmp_path / "trigger-1.000000-decode-0-x.intent"
    path.write_bytes(intent.encode("decode-0", ev, 1.0))
    with pytest.raises(intent.IntentError, match="no id"):
        intent.read(path)


def test_a_planted_temporary_symlink_is_not_followed(tmp_path: Path) -> None:
    ev = xid_event()
    target = tmp_path / "victim"
    target.write_text("keep me")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o700)
    (spool_dir / f".{intent.file_name('decode-0', ev)}.tmp").symlink_to(target)
    intent.write(spool_dir, "decode-0", ev, accepted_at=1.0)
    assert target.read_text() == "keep me"


def test_a_symlinked_intent_is_neither_listed_nor_read(tmp_path: Path) -> None:
    real = intent.write(tmp_path / "elsewhere", "decode-0", xid_event(), accepted_at=1.0)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    link = spool_dir / real.name
    link.symlink_to(real)
    assert intent.pending(spool_dir) == []
    with pytest.raises(intent.IntentError):
        intent.read(link)


def test_a_deeply_nested_record_is_an_intent_or_spool_error_not_a_recursion(tmp_path: Path) -> None:
    # found by scripts/fuzz.py (spool.read): json.loads recurses on 100,000 nested arrays and
    # its RecursionError escaped the reader, which the committer's recovery does not expect
    import zlib

    from collector.snapshot import spool

    deep = b"[" * 100_000 + b"]" * 100_000
    body = b'{"engine": "decode-0", "accepted_at": 1.0, "event": ' + deep + b"}"
    bad = tmp_path / "x.intent"
    bad.write_bytes(intent.MAGIC + body + b"\n" + f"{zlib.crc32(body):08x}".encode() + b"\n" + intent.END)
    with pytest.raises(intent.IntentError, match="RecursionError"):
        intent.read(bad)
    sp = tmp_path / "x.spool"
    sp.write_bytes(spool.MAGIC + b'{"header": ' + deep + b', "meta": {}}\n' + spool.END)
    with pytest.raises(spool.SpoolError, match="RecursionError"):
        spool.read(sp)
