"""Hostile text for the parsers: each input costs linear time and raises only the parser's own
error (or nothing), never ValueError, RecursionError or a stall of the event loop."""

from __future__ import annotations

import pytest
from cost import US_PER_BYTE_BUDGET, us_per_byte

from collector.parsers.crash_dump import CrashDumpParseError, parse_repr, parse_scheduler_output
from collector.xid.parser import XidParseError, XidRecord, parse_line

# Unterminated strings made of escaped quotes: each quote used to rescan the rest of the line.
UNTERMINATED = ["\\'", "'\\", '\\"', "\\'\\\"", "'\\'"]


@pytest.mark.parametrize("unit", UNTERMINATED)
def test_crash_dump_tokenizer_is_linear_on_unterminated_quotes(unit: str) -> None:
    text = "SchedulerOutput(scheduled_new_reqs=[" + unit * (40_000 // len(unit))
    cost = us_per_byte(parse_scheduler_output, text, swallow=(CrashDumpParseError,))
    assert cost < US_PER_BYTE_BUDGET, f"{cost:.0f} us/byte"


def test_unterminated_quote_keeps_reading_the_rest() -> None:
    # The quote is a bare character; later fields are still read, as before the fix.
    value, truncated = parse_repr("X(a='it, b=2, c=[1, 2])")
    assert not truncated
    assert value["b"] == 2 and value["c"] == [1, 2]


@pytest.mark.parametrize("tail", [" " * 8000 + "x", "\t " * 4000 + "x", " " * 8000])
def test_xid_name_field_is_linear(tail: str) -> None:
    line = "4,360,28939261,-;NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3" + tail
    cost = us_per_byte(parse_line, line)
    assert cost < US_PER_BYTE_BUDGET, f"{cost:.0f} us/byte"
    got = parse_line(line)
    assert isinstance(got, XidRecord) and got.xid == 43


def test_xid_name_blanks_are_stripped() -> None:
    got = parse_line("NVRM: Xid (PCI:0000:00:06): 43, pid=415, name=python3   , channel 0x0000000a")
    assert isinstance(got, XidRecord)
    assert (got.name, got.channel) == ("python3", "0x0000000a")


def test_huge_pid_is_not_read_and_raises_nothing_else() -> None:
    line = "NVRM: Xid (PCI:0000:00:06): 43, pid=" + "9" * 20_000 + ", name=python3, channel 0x0000000a"
    try:
        got = parse_line(line)
    except XidParseError:
        return
    assert isinstance(got, XidRecord)
    assert got.xid == 43 and got.pid is None
