"""Hostile text for the parsers: each input costs linear time and raises only the parser's own
error (or nothing), never ValueError, RecursionError or a stall of the event loop."""

from __future__ import annotations

import pytest
from cost import US_PER_BYTE_BUDGET, us_per_byte

from collector.parsers.crash_dump import (
    CrashDumpParseError,
    parse_repr,
    parse_scheduler_output,
)
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


def test_huge_numbers_in_engine_log_lines_raise_nothing() -> None:
    # found by scripts/fuzz.py: int() of a 5,000-digit line number or exit code raised ValueError
    from collector.parsers.traceback_grammar import parse_frames
    from collector.parsers.tracebacks import LogEventizer

    digits = "9" * 5000
    lines = [
        "(Worker_TP0 pid=7) ERROR 11-30 14:41:07 [multiproc_executor.py:1063] Traceback (most recent call last):",
        f'(Worker_TP0 pid=7) ERROR 11-30 14:41:07 [multiproc_executor.py:1063]   File "a.py", line {digits}, in f',
        "(Worker_TP0 pid=7) ERROR 11-30 14:41:07 [multiproc_executor.py:1063]     x()",
        "(Worker_TP0 pid=7) ERROR 11-30 14:41:07 [multiproc_executor.py:1063] RuntimeError: CUDA error: x",
        f"ERROR 11-30 14:41:08 [core.py:1] Worker proc Worker_TP1 died unexpectedly (exit code: {digits})",
        f"ERROR 11-30 14:41:08 [core.py:1] Process EngineCore (PID: {digits}) died with exit code {digits}",
    ]
    ev = LogEventizer("decode-0", reference_clock=lambda: 1.7e9)
    events = [e for line in lines for e in ev.feed(line)] + ev.flush()
    assert events  # the traceback is still an event, its frame line just not read as a number
    frames, _ = parse_frames([f'  File "a.py", line {digits}, in f'])
    assert frames == [] or all(isinstance(f.get("line"), int) for f in frames)


@pytest.mark.parametrize("name", ["e.stats." + "9" * 5000 + ".ring", "e.stats.\u00b2.ring", "e.stats.12345678901.ring"])
def test_ring_file_names_with_bad_pids_are_not_ours(name: str) -> None:
    from collector.channel.naming import parse_ring_file_name

    assert parse_ring_file_name(name) is None


def _fuzz_targets() -> list:
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("flightrec_fuzz_poison", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.targets()


TARGETS = _fuzz_targets()
MEGABYTE = 1 << 20


def _megabyte_inputs(target) -> dict[str, str]:
    import random

    rng = random.Random(12)
    seed = max(target.seeds, key=len)
    return {
        "binary": "".join(chr(rng.randrange(256)) for _ in range(MEGABYTE)),
        "seed+NUL": ((seed + "\x00") * (MEGABYTE // (len(seed) + 1) + 1))[:MEGABYTE],
    }


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_megabyte_lines_of_binary_and_nul(target) -> None:
    # one megabyte in one line (a log shipper's worst), random bytes or a real line with NULs:
    # only the parser's own error, and no more CPU per byte than the fuzzer allows
    for kind, text in _megabyte_inputs(target).items():
        cost = us_per_byte(target.run, text, swallow=target.allowed)
        assert cost < US_PER_BYTE_BUDGET, f"{kind}: {cost:.1f} us/byte"
