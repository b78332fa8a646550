"""prom_text.parse: same values as prometheus_client on real vLLM pages; errors, never crashes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from collector.parsers.prom_text import MetricsParseError, Wanted, parse
from collector.sources.vllm_metrics import KEPT_PREFIXES, KEPT_SAMPLES, WANTED

PAGES = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "vllm-metrics").glob("*.txt"))
Key = tuple[str, frozenset[tuple[str, str]]]


def reference(text: str, wanted: Wanted) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if wanted.keeps(s.name):
                out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def ours(text: str, wanted: Wanted) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for s in parse(text, wanted).samples:
        key = (s.name, frozenset(s.labels.items()))
        assert key not in out, f"duplicate sample {key}"
        out[key] = s.value
    return out


def same(a: dict[Key, float], b: dict[Key, float]) -> bool:
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


def test_there_are_captured_pages() -> None:
    assert len(PAGES) >= 3


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_same_values_as_prometheus_client_for_every_kept_family(page: Path) -> None:
    text = page.read_text()
    expected = reference(text, WANTED)
    got = ours(text, WANTED)
    assert same(got, expected)
    # Every exact family we keep is on a real vLLM page (connector prefixes only when present).
    assert {name for name, _ in got} >= KEPT_SAMPLES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_same_values_when_keeping_everything_of_vllm(page: Path) -> None:
    # Widest filter: every vllm:* sample, buckets excepted: exercises labels such as le=, quantile.
    text = page.read_text()
    wide = Wanted([], ["vllm:"])
    expected = reference(text, wide)
    assert len(expected) > 3 * len(KEPT_SAMPLES)
    assert same(ours(text, wide), expected)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_types_come_from_the_page(page: Path) -> None:
    text = page.read_text()
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    parsed = parse(text, WANTED).types
    assert parsed["vllm:num_requests_running"] == "gauge"
    assert parsed["vllm:prompt_tokens_total"] == "counter" == types["vllm:prompt_tokens"]
    assert parsed["vllm:e2e_request_latency_seconds"] == "histogram"


SYNTHETIC = [
    # (text, expected samples as (name, labels, value))
    ('m{a="x,y}z",b="q\\"uo\\\\te\\n"} 1\n', [("m", {"a": "x,y}z", "b": 'q"uo\\te\n'}, 1.0)]),
    ("m NaN\n", [("m", {}, math.nan)]),
    ('m +Inf\nm{a="1"} -Inf\n', [("m", {}, math.inf), ("m", {"a": "1"}, -math.inf)]),
    ("m 1.5e3 1700000000000\n", [("m", {}, 1500.0)]),
    ("# HELP m some help, with {braces}\n# TYPE m gauge\n\nm 2\n", [("m", {}, 2.0)]),
    ("  m\t 3 \r\n", [("m", {}, 3.0)]),
    ('m{a="1",} 4\n', [("m", {"a": "1"}, 4.0)]),
    ("m{} 5\n", [("m", {}, 5.0)]),
    ("m_other 1\nm 6\n", [("m", {}, 6.0)]),  # a longer name that shares the prefix is not kept
    ("", []),
]


@pytest.mark.parametrize("text, expected", SYNTHETIC)
def test_synthetic_lines_agree_with_prometheus_client(text: str, expected: list) -> None:
    wanted = Wanted(["m"])
    got = [(s.name, s.labels, s.value) for s in parse(text, wanted).samples]
    assert len(got) == len(expected)
    for (name, labels, value), (ename, elabels, evalue) in zip(got, expected, strict=False):
        assert (name, labels) == (ename, elabels)
        assert value == evalue or (math.isnan(value) and math.isnan(evalue))
    assert same(ours(text, wanted), reference(text, wanted))


def test_timestamp_is_in_seconds() -> None:
    [sample] = parse("m 1 1700000000123\n", Wanted(["m"])).samples
    assert sample.timestamp == pytest.approx(1700000000.123)


REAL = PAGES[0].read_text() if PAGES else ""
MALFORMED = [
    ("truncated mid-line", REAL[: len(REAL) // 2]),
    ("truncated mid-labels", REAL[: REAL.index("vllm:num_requests_running{") + 40]),
    ("no newline at end", "vllm:num_requests_running 1"),
    ("unbalanced brace", 'vllm:num_requests_running{engine="0" 1\n'),
    ("unterminated quote", 'vllm:num_requests_running{engine="0} 1\n'),
    ("missing quotes", "vllm:num_requests_running{engine=0} 1\n"),
    ("missing comma", 'vllm:num_requests_running{a="0" b="1"} 1\n'),
    ("duplicate label", 'vllm:num_requests_running{a="0",a="1"} 1\n'),
    ("non-numeric value", "vllm:num_requests_running abc\n"),
    ("underscore value", "vllm:num_requests_running 1_000\n"),
    ("no value", "vllm:num_requests_running\n"),
    ("no value after labels", 'vllm:num_requests_running{a="0"}\n'),
    ("name glued to value", "vllm:num_requests_running1\n"),
    ("bad timestamp", "vllm:num_requests_running 1 soon\n"),
    ("infinite timestamp", "vllm:num_requests_running 1 +Inf\n"),
    ("extra token", "vllm:num_requests_running 1 2 3\n"),
    ("TYPE without type", "# TYPE vllm:num_requests_running\nvllm:num_requests_running 1\n"),
    ("TYPE unknown", "# TYPE vllm:num_requests_running thing\nvllm:num_requests_running 1\n"),
    ("kept prefix, broken line", 'vllm:nixl_xfer_time_seconds_sum{engine="0" 1\n'),
]


@pytest.mark.parametrize("text", [t for _, t in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_malformed_pages_raise_our_error(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse(text, WANTED)


def test_broken_lines_of_families_we_skip_are_not_read() -> None:
    # The cost model: lines we do not keep are never parsed, so they cannot fail the page.
    text = 'vllm:some_bucket{le="0.1" 1\nvllm:num_requests_running{engine="0"} 2\n'
    assert [s.value for s in parse(text, WANTED).samples] == [2.0]


# Property tests: whatever the input, parse returns or raises MetricsParseError, nothing else.
LINE_ALPHABET = st.sampled_from(list('vlm:_nurqesti{}="\\,# \t\n\r0123456789.+-eENaIf') + ["\x00", "é"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_arbitrary_text_raises_only_our_error(text: str) -> None:
    try:
        parse(text, WANTED)
    except MetricsParseError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(sorted(KEPT_SAMPLES) + list(KEPT_PREFIXES) + ["# TYPE vllm:num_requests_running "]), min_size=1, max_size=4),
    st.lists(st.text(LINE_ALPHABET, max_size=30), min_size=1, max_size=4),
)
def test_lines_that_look_like_kept_samples_raise_only_our_error(names: list[str], tails: list[str]) -> None:
    text = "".join(n + t + "\n" for n, t in zip(names, tails, strict=False))
    try:
        parse(text, WANTED)
    except MetricsParseError:
        pass


TEXTS = [page.read_text() for page in PAGES]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_real_pages_cut_or_damaged_anywhere_raise_only_our_error(data: st.DataObject) -> None:
    text = TEXTS[data.draw(st.integers(0, len(TEXTS) - 1))]
    cut = data.draw(st.integers(0, len(text)))
    junk = data.draw(st.text(LINE_ALPHABET, max_size=8))
    damaged = text[:cut] + junk + text[cut + data.draw(st.integers(0, 20)) :]
    try:
        got = ours(damaged, WANTED)
    except MetricsParseError:
        return
    # When it parses, the kept samples both parsers read carry the same values.
    try:
        expected = reference(damaged, WANTED)
    except Exception:  # noqa: BLE001 - prometheus_client is the oracle here, not the subject
        return  # it rejects some lines of families we skip without reading
    common = got.keys() & expected.keys()
    assert same({k: got[k] for k in common}, {k: expected[k] for k in common})


def test_wanting_nothing_keeps_nothing() -> None:
    assert parse(TEXTS[0], Wanted([])).samples == []


def test_counter_type_is_found_with_or_without_total() -> None:
    for type_line in ("# TYPE m_total counter\n", "# TYPE m counter\n"):
        page = parse(type_line + "m_total 3\n", Wanted(["m_total"]))
        assert [s.value for s in page.samples] == [3.0]
        assert "counter" in page.types.values()
