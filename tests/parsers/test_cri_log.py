"""The CRI log format the kubelet keeps a container's output in: records, partial lines joined
per stream, foreign lines passed through."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from collector.parsers.cri_log import CriJoiner, parse_cri_line, parse_time

TS = "2026-12-03T10:00:00.123456789Z"


def test_a_full_record() -> None:
    rec = parse_cri_line(f"{TS} stdout F INFO 12-03 10:00:00 [api_server.py:1] started")
    assert rec is not None
    assert rec.stream == "stdout" and not rec.partial
    assert rec.message == "INFO 12-03 10:00:00 [api_server.py:1] started"
    assert rec.ts == datetime(2026, 12, 3, 10, 0, 0, 123456, tzinfo=UTC).timestamp()


def test_partial_tag_extra_tags_offsets_and_empty_messages() -> None:
    rec = parse_cri_line(f"{TS} stderr P first half")
    assert rec is not None and rec.partial and rec.stream == "stderr"
    # newer runtimes may add tags after a colon; the first is what matters
    assert parse_cri_line(f"{TS} stdout F:x message") == (rec.ts, "stdout", False, "message")
    assert parse_cri_line("2026-12-03T11:00:00+01:00 stdout F m").ts == parse_time("2026-12-03T10:00:00Z")  # type: ignore[union-attr]
    # an empty line the process wrote is a record with an empty message
    assert parse_cri_line(f"{TS} stdout F").message == ""  # type: ignore[union-attr]
    assert parse_cri_line(f"{TS} stdout F ").message == ""  # type: ignore[union-attr]
    # spaces inside the message are kept as written
    assert parse_cri_line(f"{TS} stdout F   indented  ").message == "  indented  "  # type: ignore[union-attr]


def test_not_a_record() -> None:
    for line in ("", "INFO 12-03 10:00:00 [x.py:1] plain", f"{TS} stdin F x", f"{TS} stdout f x", "2026-12-03 stdout F x"):
        assert parse_cri_line(line) is None, line


def test_partials_are_joined_per_stream_in_order() -> None:
    j = CriJoiner()
    assert j.feed(f"{TS} stderr P Traceback (most ") == []
    # stdout interleaves between the pieces of a stderr line
    assert j.feed(f"{TS} stdout F INFO a line") == ["INFO a line"]
    assert j.feed(f"{TS} stderr P recent call ") == []
    assert j.has_partial
    assert j.feed(f"{TS} stderr F last):") == ["Traceback (most recent call last):"]
    assert not j.has_partial and j.records == 4


def test_a_container_that_died_mid_line_gives_what_it_wrote() -> None:
    j = CriJoiner()
    j.feed(f"{TS} stderr P RuntimeError: CUDA error: unspecified launch")
    assert j.take_partial() == ["RuntimeError: CUDA error: unspecified launch"]
    assert not j.has_partial


def test_a_runaway_partial_is_cut_at_the_bound() -> None:
    j = CriJoiner(max_bytes=10)
    assert j.feed(f"{TS} stdout P 123456") == []
    assert j.feed(f"{TS} stdout P 7890ab") == ["1234567890ab"]
    assert not j.has_partial


def test_foreign_lines_pass_through() -> None:
    j = CriJoiner()
    assert j.feed("INFO 12-03 10:00:00 [x.py:1] plain") == ["INFO 12-03 10:00:00 [x.py:1] plain"]
    assert j.foreign == 1


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=40), min_size=1, max_size=8), st.sampled_from(["stdout", "stderr"])
)
def test_a_line_cut_anywhere_comes_back_whole(pieces: list[str], stream: str) -> None:
    j = CriJoiner()
    out: list[str] = []
    for i, piece in enumerate(pieces):
        tag = "F" if i == len(pieces) - 1 else "P"
        out += j.feed(f"{TS} {stream} {tag} {piece}")
    assert out == ["".join(pieces)]


@given(st.text(max_size=200))
def test_never_raises(line: str) -> None:
    parse_cri_line(line)
    CriJoiner().feed(line)
