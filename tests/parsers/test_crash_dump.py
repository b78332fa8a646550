"""vLLM's crash dump reprs -> rows and stats, over the real dump of a CPU run (crash.log)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.parsers.crash_dump import (
    CrashDumpParseError,
    parse_repr,
    parse_row_mirrors,
    parse_scheduler_output,
    parse_scheduler_stats,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"
OUTPUT = "Dumping scheduler output for model execution: "
STATS = "Dumping scheduler stats: "


def _dump_lines(name: str, marker: str) -> list[str]:
    text = (FIXTURES / name).read_text(encoding="utf-8", errors="replace")
    return [line.split(marker, 1)[1] for line in text.splitlines() if marker in line]


REAL_OUTPUTS = [t for n in ("crash.log", "crash-tp2.log") for t in _dump_lines(n, OUTPUT)]
REAL_STATS = [t for n in ("crash.log", "crash-tp2.log") for t in _dump_lines(n, STATS)]


def _printed_ids(text: str) -> list[str]:
    """Request ids read independently: the quoted list of CachedRequestData plus new ones."""
    cached = re.search(r"CachedRequestData\(req_ids=\[([^\]]*)\]", text)
    ids = re.findall(r"'([^']+)'", cached.group(1)) if cached else []
    return re.findall(r"NewRequestData\(req_id=([^,]+),", text) + ids


@pytest.mark.parametrize("text", REAL_OUTPUTS, ids=lambda t: f"{len(t)}chars")
def test_real_scheduler_output(text):
    out = parse_scheduler_output(text)
    assert out["truncated"] is False
    ids = [r["request_id"] for r in out["requests"]]
    assert ids == _printed_ids(text)
    scheduled = int(re.search(r"total_num_scheduled_tokens=(\d+)", text).group(1))
    assert out["scheduler"]["total_num_scheduled_tokens"] == scheduled
    assert sum(r["num_scheduled_tokens"] for r in out["requests"]) == scheduled
    for row in out["requests"]:
        assert isinstance(row["num_computed_tokens"], int)
        if row["new"]:
            assert isinstance(row["prompt_len"], int) and row["prompt_len"] > 0
        else:
            assert row["num_output_tokens"] >= 0


def test_real_scheduler_output_values():
    [text] = _dump_lines("crash.log", OUTPUT)
    computed = [int(x) for x in re.search(r"num_computed_tokens=\[([^\]]*)\]", text).group(1).split(",")]
    outputs = [int(x) for x in re.search(r"num_output_tokens=\[([^\]]*)\]", text).group(1).split(",")]
    rows = parse_scheduler_output(text)["requests"]
    assert [r["num_computed_tokens"] for r in rows] == computed
    assert [r["num_output_tokens"] for r in rows] == outputs


@pytest.mark.parametrize("text", REAL_STATS, ids=lambda t: f"{len(t)}chars")
def test_real_scheduler_stats(text):
    stats = parse_scheduler_stats(text)
    for name, alias in (("num_running_reqs", "running"), ("num_waiting_reqs", "waiting"), ("step_counter", "step_counter")):
        value = int(re.search(name + r"=(\d+)", text).group(1))
        assert stats[name] == stats[alias] == value
    usage = float(re.search(r"kv_cache_usage=([0-9.e-]+)", text).group(1))
    assert stats["kv_cache_usage"] == usage
    assert isinstance(stats["prefix_cache_stats"], dict)
    assert stats["prefix_cache_stats"]["hits"] == int(re.search(r"PrefixCacheStats\(.*?\bhits=(\d+)", text).group(1))
    assert stats["num_kv_fetch_reqs_by_stage"] == {"waiting_to_start": 0, "in_progress": 0, "completed_waiting": 0}
    assert stats["truncated"] is False


def test_non_anonymised_new_request_counts_prompt_tokens():
    # NewRequestData.__repr__ (prompt_token_ids as a list) rather than anon_repr
    text = (
        "SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=cmpl-9,prompt_token_ids="
        "[1, 5, 9, 13],prefill_token_ids=None,mm_features=[],sampling_params=SamplingParams("
        "n=1, stop=[')', '],'], max_tokens=16),block_ids=([1, 2],),num_computed_tokens=0,"
        "lora_request=None,prompt_embeds_shape=None)], num_scheduled_tokens={cmpl-9: 4}, "
        "total_num_scheduled_tokens=4)"
    )
    [row] = parse_scheduler_output(text)["requests"]
    assert row == {"request_id": "cmpl-9", "prompt_len": 4, "num_computed_tokens": 0, "num_output_tokens": 0, "new": True, "num_scheduled_tokens": 4}


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9])
def test_truncated_dump_keeps_what_was_printed(cut):
    [text] = _dump_lines("crash.log", OUTPUT)
    full = parse_scheduler_output(text)["requests"]
    part = parse_scheduler_output(text[: int(len(text) * cut)])
    assert part["truncated"] is True
    # every row read from the cut text is a prefix of the full rows, ids intact
    assert [r["request_id"] for r in part["requests"]] == [r["request_id"] for r in full[: len(part["requests"])]]


def test_not_a_dump():
    with pytest.raises(CrashDumpParseError):
        parse_scheduler_output("EngineCore encountered a fatal error.")
    with pytest.raises(CrashDumpParseError):
        parse_scheduler_stats("SchedulerStats)(")
    with pytest.raises(CrashDumpParseError):
        parse_repr("[" * 5000)


def test_repr_reader():
    value, truncated = parse_repr("X(a=1, b='q, )', c=[None, true, 2.5], d={k: <CUDAGraphMode.NONE: 0>}, e=set())")
    assert not truncated
    assert value == {"__type__": "X", "a": 1, "b": "q, )", "c": [None, True, 2.5], "d": {"k": "<CUDAGraphMode.NONE: 0>"}, "e": {"__type__": "set"}}


_ALPHABET = st.sampled_from(list("()[]{},:='\"<> \\aZ0-9._") + ["SchedulerOutput(", "SchedulerStats(", "req_ids=", "NewRequestData(", "\x00", "é"])


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(), st.lists(_ALPHABET, max_size=80).map("".join), st.integers(0, 4000).map(lambda n: REAL_OUTPUTS[0][:n] if REAL_OUTPUTS else "")
    )
)
def test_any_text_raises_only_its_own_error(text):
    for parse in (parse_scheduler_output, parse_scheduler_stats, parse_repr):
        try:
            parse(text)
        except CrashDumpParseError:
            pass


# vLLM's own dump code on vLLM's own HiSparse classes (make_hisparse_dump.py in the fixtures).
HISPARSE = (FIXTURES / "hisparse-dump.log").read_text(encoding="utf-8").splitlines()
HISPARSE_OUTPUT = HISPARSE[0].split(OUTPUT, 1)[1]


def _printed_mirrors(text: str) -> dict[str, int]:
    """Rows per request read independently: each ``id: [SparseKVRowMirror(...), ...]`` entry of
    row_mirrors (ids bare or quoted, lists or tuples), its num_rows summed."""
    block = text[text.index("row_mirrors={") :]
    block = block[: block.index("}, all_context_pages_resident")]
    span = r"SparseKVRowMirror\(source_starts=[\[(][^\])]*[\])], destination_start=\d+, num_rows=\d+\)"
    entries = re.findall(r"'?(cmpl-[\w-]+)'?: [\[(]((?:" + span + r"[, ]*)+)[\])]", block)
    return {rid: sum(int(n) for n in re.findall(r"num_rows=(\d+)", spans)) for rid, spans in entries}


def test_hisparse_row_mirrors_per_request() -> None:
    out = parse_scheduler_output(HISPARSE_OUTPUT)
    expected = _printed_mirrors(HISPARSE_OUTPUT)
    assert len(expected) == 3 and out["truncated"] is False
    assert {rid: m["rows"] for rid, m in out["row_mirrors"].items()} == expected
    assert [r["request_id"] for r in out["requests"]] == _printed_ids(HISPARSE_OUTPUT)
    for row in out["requests"]:
        # scheduled without an entry: no mirror work this step (0, known), not unknown
        assert row["mirror_rows"] == expected.get(row["request_id"], 0)
    assert any(r["mirror_rows"] == 0 for r in out["requests"])
    assert out["row_mirrors"][max(expected, key=expected.get)]["spans"] == 2


def test_hisparse_metadata_repr() -> None:
    # the dataclass repr of the same metadata: quoted keys, tuples
    got = parse_row_mirrors(HISPARSE[1])
    assert got["truncated"] is False
    assert {rid: m["rows"] for rid, m in got["row_mirrors"].items()} == _printed_mirrors(HISPARSE[1])


def test_hisparse_dump_cut_inside_row_mirrors() -> None:
    at = HISPARSE_OUTPUT.index("row_mirrors={") + 40
    out = parse_scheduler_output(HISPARSE_OUTPUT[:at])
    assert out["truncated"] is True
    # no scheduled row was cut off here (they come first); what the mirrors left unread is None
    assert all(r["mirror_rows"] is None or isinstance(r["mirror_rows"], int) for r in out["requests"])
    assert any(r["mirror_rows"] is None for r in out["requests"])


def test_dump_without_hisparse_has_no_mirror_column() -> None:
    out = parse_scheduler_output(REAL_OUTPUTS[0])
    assert "row_mirrors" not in out and all("mirror_rows" not in r for r in out["requests"])


def test_crash_dump_event_carries_the_mirrors() -> None:
    from collector.parsers.tracebacks import LogEventizer

    ev = LogEventizer("decode-0", reference_clock=lambda: 1.7e9)
    events = [e for line in HISPARSE[:1] for e in ev.feed(line)] + ev.flush()
    [dump] = [e for e in events if e.kind.value == "crash_dump"]
    assert {rid: m["rows"] for rid, m in dump.data["row_mirrors"].items()} == _printed_mirrors(HISPARSE_OUTPUT)
    assert {r["request_id"]: r["mirror_rows"] for r in dump.data["requests"]}[_printed_ids(HISPARSE_OUTPUT)[-1]] == 0
