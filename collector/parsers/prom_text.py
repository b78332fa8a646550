"""A fast parser for the Prometheus text exposition format, restricted to the families we keep.

A vLLM ``/metrics`` page is about 54 KB and 430 samples, most of them histogram buckets we
never look at. ``prometheus_client.parser`` builds every family and sample of the page; this
parser looks at a line only when it starts with a wanted name (one C-level
``str.startswith`` over a tuple of prefixes), so its cost is one pass over the lines plus the few
samples we keep. It is written by hand only because it is measured faster: see
``bench/bench_prom_text.py`` (ours vs ``prometheus_client`` on the captured vLLM pages).

What it checks, so that a broken page is an error and not wrong numbers:

- the page must end with a newline: a body cut in the middle of a line (the text format has no
  ``# EOF`` marker) leaves a last line without one;
- every kept sample line must be well formed: a valid name, balanced ``{...}`` with quoted label
  values (escapes ``\\\\``, ``\\"`` and ``\\n``; commas and braces allowed inside quotes), a
  numeric value (``NaN``, ``+Inf``, ``-Inf`` included), and an optional integer timestamp.

Lines of families we do not keep are skipped without being read, so a malformed line there is
not reported. Any failure raises ``MetricsParseError``; nothing else escapes ``parse``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from collector.errors import InputError

__all__ = ["MetricsParseError", "Sample", "ParsedPage", "Wanted", "parse"]


class MetricsParseError(InputError):
    """The page (or one kept line of it) is not valid exposition text. Carries the line number."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


class Sample(NamedTuple):
    name: str  # full sample name, e.g. "vllm:e2e_request_latency_seconds_sum"
    labels: dict[str, str]
    value: float
    timestamp: float | None = None  # seconds, when the line carries one (milliseconds on the wire)


@dataclass(slots=True)
class ParsedPage:
    samples: list[Sample]
    types: dict[str, str] = field(default_factory=dict)  # family name -> "counter", "gauge", ...


# Suffixes a histogram or summary family adds to its sample names.
_HISTOGRAM_PARTS = ("_sum", "_count", "_bucket", "_created")


class Wanted:
    """Which samples to keep.

    ``samples``: exact sample names (``vllm:num_requests_running``,
    ``vllm:e2e_request_latency_seconds_sum``). ``prefixes``: keep every sample whose name starts
    with one of them (``vllm:nixl_``), except histogram ``_bucket`` and ``_created`` samples,
    which we never use. ``# TYPE`` lines are read only for families these could match.
    """

    __slots__ = ("samples", "prefixes", "line_prefixes", "candidates")

    def __init__(self, samples: Iterable[str], prefixes: Iterable[str] = ()) -> None:
        self.samples = frozenset(samples)
        self.prefixes = tuple(prefixes)
        families = {_family_of(name) for name in self.samples}
        # A counter's TYPE line names it with "_total" (prometheus_client's text format) or
        # without (OpenMetrics style): look for both.
        families |= {name[: -len("_total")] for name in families if name.endswith("_total")}
        # What a line must start with to be looked at at all.
        sample_heads = sorted(self.samples) + list(self.prefixes)
        type_heads = sorted(families) + list(self.prefixes)
        self.line_prefixes: tuple[str, ...] = tuple(sample_heads) + tuple(f"# TYPE {head}" for head in type_heads)
        # One regex finds every such line (after a newline and optional blanks) in one C-level
        # pass over the page, cheaper than a Python loop over the lines with str.startswith
        # (bench/bench_prom_text.py). Matched against "\n" + page.
        alternatives = []
        if sample_heads:
            alternatives.append(_literal_alternation(sample_heads))
            alternatives.append("# TYPE " + _literal_alternation(type_heads))
        self.candidates = re.compile(r"\n[ \t]*((?:" + "|".join(alternatives) + r")[^\n]*)" if alternatives else r"(?!)")

    def keeps(self, name: str) -> bool:
        if name in self.samples:
            return True
        if self.prefixes and name.startswith(self.prefixes):
            return not name.endswith(("_bucket", "_created"))
        return False


def _literal_alternation(heads: list[str]) -> str:
    """A regex matching any of ``heads`` literally, their common start factored out (speed)."""
    common = os.path.commonprefix(heads)
    rests = sorted({head[len(common) :] for head in heads}, key=len, reverse=True)
    return re.escape(common) + "(?:" + "|".join(re.escape(rest) for rest in rests) + ")"


def _family_of(sample_name: str) -> str:
    for suffix in _HISTOGRAM_PARTS:
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


# One sample line: name, optional {labels}, value, optional timestamp. The label block is checked
# whole by the regex (pairs separated by commas, an optional trailing comma; commas and braces
# inside quoted values do not end it), then its pairs are read with a second one. Quoted strings
# use the unrolled form "[^"\\]*(?:\\.[^"\\]*)*": no nested repetition, so no input makes the
# regex backtrack exponentially.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_QUOTED_BODY = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'
_PAIR = rf'{_LABEL_NAME}[ \t]*=[ \t]*"{_QUOTED_BODY}"'
_SAMPLE_RE = re.compile(
    rf"({_NAME})"
    rf"(?:[ \t]*\{{[ \t]*((?:{_PAIR}[ \t]*,[ \t]*)*(?:{_PAIR}[ \t]*)?)\}}[ \t]*|[ \t]+)"
    r"([^ \t]+)(?:[ \t]+([^ \t]+))?[ \t]*"
)
_PAIRS_RE = re.compile(rf'({_LABEL_NAME})[ \t]*=[ \t]*"({_QUOTED_BODY})"')
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})


def _unescape(match: re.Match[str]) -> str:
    # Like prometheus_client: an unknown escape stays as written.
    return _ESCAPES.get(match.group(1), match.group(0))


def _parse_labels(block: str) -> dict[str, str]:
    pairs = _PAIRS_RE.findall(block)
    labels = dict(pairs)
    if len(labels) != len(pairs):
        raise MetricsParseError(f"duplicate label in {{{block[:120]}}}")
    if "\\" in block:
        labels = {k: _ESCAPE_RE.sub(_unescape, v) for k, v in labels.items()}
    return labels


def _parse_float(token: str) -> float:
    # float() also accepts "1_000"; the text format does not.
    if "_" in token:
        raise MetricsParseError(f"invalid value {token[:40]!r}")
    try:
        return float(token)
    except ValueError:
        raise MetricsParseError(f"invalid value {token[:40]!r}") from None


def _parse_sample(line: str) -> Sample:
    match = _SAMPLE_RE.fullmatch(line)
    if match is None:
        raise MetricsParseError(f"malformed sample line {line[:120]!r}")
    name, block, value_token, ts_token = match.groups()
    labels = _parse_labels(block) if block else {}
    value = _parse_float(value_token)
    timestamp = None
    if ts_token is not None:
        ts = _parse_float(ts_token)
        if not math.isfinite(ts):
            raise MetricsParseError(f"invalid timestamp {ts_token[:40]!r}")
        timestamp = ts / 1000.0
    return Sample(name, labels, value, timestamp)


def _parse_type(line: str, types: dict[str, str]) -> None:
    parts = line.split(None, 3)
    if len(parts) != 4 or parts[3].strip() not in _TYPES:
        raise MetricsParseError(f"malformed TYPE line {line[:120]!r}")
    types[parts[2]] = parts[3].strip()


def parse(text: str, wanted: Wanted) -> ParsedPage:
    """Parse one exposition page, keeping only ``wanted`` samples (in page order)."""
    if not isinstance(text, str):
        raise MetricsParseError(f"expected text, got {type(text).__name__}")
    if text and not text.endswith("\n"):
        raise MetricsParseError("truncated page: the last line has no newline")
    samples: list[Sample] = []
    types: dict[str, str] = {}
    keeps = wanted.keeps
    page = "\n" + text
    for match in wanted.candidates.finditer(page):
        line = match.group(1).rstrip("\r")
        try:
            if line[0] == "#":
                _parse_type(line, types)
                continue
            sample = _parse_sample(line)
        except MetricsParseError as exc:
            lineno = page.count("\n", 0, match.start() + 1)
            raise MetricsParseError(str(exc), line=lineno) from None
        # The prefix test also passes longer names (num_requests_waiting_by_reason starts with
        # num_requests_waiting): keep only the exact names asked for.
        if keeps(sample.name):
            samples.append(sample)
    return ParsedPage(samples, types)
