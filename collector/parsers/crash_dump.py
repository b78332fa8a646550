"""vLLM's crash dump (``Dumping scheduler output ...``, ``Dumping scheduler stats: ...``) -> dicts.

When the engine core dies inside a step, vLLM 0.32 logs (``vllm/logging_utils/dump_input.py``)::

    Dumping input data for V1 LLM engine (v0.32.0) with config: model='...', ...
    Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[
        NewRequestData(req_id=cmpl-..-0,prompt_token_ids_len=300,...,num_computed_tokens=0,...)],
        scheduled_cached_reqs=CachedRequestData(req_ids=['cmpl-..'],...,num_computed_tokens=
        [301],num_output_tokens=[1]), num_scheduled_tokens={cmpl-..: 1}, ...)
    Dumping scheduler stats: SchedulerStats(num_running_reqs=3, ..., kv_cache_usage=0.03, ...)

With the HiSparse connector (alone or inside MultiConnector) the scheduler output carries the
step's host-mirror work in ``kv_connector_metadata``, printed by the same walk of ``__dict__``::

    kv_connector_metadata=MultiKVConnectorMetadata(metadata=[NixlConnectorMetadata(...),
        HiSparseConnectorMetadata(command=..., row_mirrors={cmpl-..-0: [SparseKVRowMirror(
        source_starts=[0, 4096], destination_start=128, num_rows=512), ...], ...}, ...)], ...)

Each request's mirror rows this step are the sum of its spans' ``num_rows`` (what the recorder's
``mirror_rows`` column holds); a request scheduled without an entry mirrored none.

These are reprs, not JSON: request ids are unquoted inside ``NewRequestData`` and as dict keys,
quoted in lists; nested calls (``SamplingParams(...)``, ``Tensor(shape=torch.Size([3]), ...)``)
and enum reprs (``<CUDAGraphMode.NONE: 0>``) appear. ``parse_repr`` reads that loose grammar
into Python values (a call becomes ``{"__type__": name, field: value, ...}``); text that ends
early (a line cut by a log shipper) yields what was read so far, flagged as truncated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from collector.errors import InputError

MAX_DEPTH = 100  # deeper nesting is not a vLLM repr; refuse it instead of recursing on


class CrashDumpParseError(InputError):
    """The text is not a SchedulerOutput/SchedulerStats repr we can read."""


def _token_regex(quotes: str) -> re.Pattern[str]:
    strings = {"'": r"'(?:[^'\\]|\\.)*'", '"': r'"(?:[^"\\]|\\.)*"'}
    branch = "|".join(strings[q] for q in quotes)
    return re.compile(
        (f"(?P<str>{branch})|" if branch else "") + r"(?P<punct>[()\[\]{},:=])"
        r"|(?P<enum><[^<>()\[\]{}]{0,200}>)"
        r"|(?P<atom>[^\s()\[\]{},:='\"<]+)"
        r"|(?P<space>\s+)"
        r"|(?P<other>.)",
        re.DOTALL,
    )


# One pattern per set of quote characters that can still open a string. A quote whose string
# runs unterminated to the end of the text is read as a bare character; every later quote of the
# same kind is unterminated too (its scan runs in step with the first one's from there on), so
# that kind is dropped from the pattern rather than rescanned to the end at each occurrence,
# which would make a line of backslash-quotes quadratic.
_TOKENS = {q: _token_regex(q) for q in ("'\"", "'", '"', "")}

_ATOM = "atom"
_OPEN = {"(": ")", "[": "]", "{": "}"}


@dataclass(slots=True)
class _Tok:
    kind: str
    text: str


def _tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    quotes = "'\""
    pattern = _TOKENS[quotes]
    pos, end = 0, len(text)
    while pos < end:
        m = pattern.match(text, pos)
        if m is None:  # unreachable: the last branch matches any character
            raise CrashDumpParseError(f"untokenizable text at {pos}")
        pos = m.end()
        kind = m.lastgroup or "other"
        if kind == "space":
            continue
        if kind == "str":
            out.append(_Tok("str", _unquote(m.group())))
        elif kind == "punct":
            out.append(_Tok(m.group(), m.group()))
        else:  # atom, enum repr, stray character: all read as bare words
            if kind == "other" and m.group() in quotes:  # an unterminated string
                quotes = quotes.replace(m.group(), "")
                pattern = _TOKENS[quotes]
            out.append(_Tok(_ATOM, m.group()))
    return out


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body.replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")


class _Truncated(Exception):
    """Input ended inside a structure; carries the partial value."""

    def __init__(self, value: Any) -> None:
        super().__init__("truncated")
        self.value = value


_WORDS = {"None": None, "null": None, "True": True, "true": True, "False": False, "false": False}


def scalar(word: str) -> Any:
    # vLLM's dumper writes some fields through json.dumps: null/true/false appear too.
    if word in _WORDS:
        return _WORDS[word]
    try:
        return int(word)
    except ValueError:
        pass
    try:
        return float(word)
    except ValueError:
        return word


class _Parser:
    def __init__(self, tokens: list[_Tok]) -> None:
        self.toks = tokens
        self.i = 0

    def peek(self, offset: int = 0) -> _Tok | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CrashDumpParseError(f"nesting deeper than {MAX_DEPTH}")
        tok = self.peek()
        if tok is None:
            raise _Truncated(None)
        if tok.kind in _OPEN:
            self.i += 1
            return self.container(tok.kind, None, depth)
        if tok.kind == "str":
            self.i += 1
            return tok.text
        if tok.kind == _ATOM:
            # Bare words run on until a separator: "cmpl-1 abc" or "torch.Size".
            words = [tok.text]
            self.i += 1
            while (nxt := self.peek()) is not None and nxt.kind in (_ATOM, "str"):
                words.append(nxt.text)
                self.i += 1
            nxt = self.peek()
            if nxt is not None and nxt.kind == "(" and len(words) == 1:
                self.i += 1
                return self.container("(", words[0], depth)
            return scalar(" ".join(words)) if len(words) == 1 else " ".join(words)
        raise CrashDumpParseError(f"unexpected {tok.text!r} at token {self.i}")

    def container(self, opener: str, name: str | None, depth: int) -> Any:
        closer = _OPEN[opener]
        items: list[Any] = []
        fields: dict[str, Any] = {}
        is_mapping = opener == "{"
        while True:
            tok = self.peek()
            if tok is None:
                raise _Truncated(self._build(opener, name, items, fields, is_mapping))
            if tok.kind == closer:
                self.i += 1
                return self._build(opener, name, items, fields, is_mapping)
            if tok.kind == ",":
                self.i += 1
                continue
            if tok.kind in (")", "]", "}"):
                raise CrashDumpParseError(f"unbalanced {tok.text!r} at token {self.i}")
            nxt = self.peek(1)
            sep = "=" if opener == "(" else ":"
            if tok.kind in (_ATOM, "str") and nxt is not None and nxt.kind == sep:
                key = tok.text
                self.i += 2
                try:
                    fields[key] = self.value(depth + 1)
                except _Truncated as exc:
                    fields[key] = exc.value
                    raise _Truncated(self._build(opener, name, items, fields, is_mapping)) from None
                continue
            try:
                items.append(self.value(depth + 1))
            except _Truncated as exc:
                if exc.value is not None:
                    items.append(exc.value)
                raise _Truncated(self._build(opener, name, items, fields, is_mapping)) from None

    @staticmethod
    def _build(opener: str, name: str | None, items: list[Any], fields: dict[str, Any], mapping: bool) -> Any:
        if name is not None:
            out: dict[str, Any] = {"__type__": name}
            if items:
                out["__args__"] = items
            out.update(fields)
            return out
        if mapping:
            return fields if fields or not items else items  # {a, b}: a set printed by repr
        if fields:
            return fields
        return items


def parse_repr(text: str) -> tuple[Any, bool]:
    """Read one repr-like value. Returns ``(value, truncated)``."""
    if not isinstance(text, str):
        raise CrashDumpParseError(f"not text: {type(text).__name__}")
    parser = _Parser(_tokenize(text))
    try:
        value = parser.value(0)
    except _Truncated as exc:
        if exc.value is None:
            raise CrashDumpParseError("empty value") from None
        return exc.value, True
    except RecursionError as exc:  # MAX_DEPTH keeps us far from it; kept as a last guard
        raise CrashDumpParseError("nesting too deep") from exc
    return value, False


def _call(text: str, type_name: str) -> tuple[dict[str, Any], bool]:
    start = text.find(type_name + "(")
    if start < 0:
        raise CrashDumpParseError(f"no {type_name}( in text")
    value, truncated = parse_repr(text[start:])
    if not isinstance(value, dict) or value.get("__type__") != type_name:
        raise CrashDumpParseError(f"{type_name} repr not readable")
    return value, truncated


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _req_id(value: Any) -> str | None:
    return None if value is None else str(value)


def _new_request_row(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or "req_id" not in item:
        return None
    prompt_len = _as_int(item.get("prompt_token_ids_len"))
    if prompt_len is None and isinstance(item.get("prompt_token_ids"), list):
        prompt_len = len(item["prompt_token_ids"])  # the non-anonymised repr
    if prompt_len is None:
        prompt_len = _as_int(item.get("num_prompt_tokens"))
    return {
        "request_id": _req_id(item.get("req_id")),
        "prompt_len": prompt_len,
        "num_computed_tokens": _as_int(item.get("num_computed_tokens")),
        "num_output_tokens": 0,
        "new": True,
    }


def _cached_rows(cached: Any) -> list[dict[str, Any]]:
    if not isinstance(cached, dict):
        return []
    ids = _as_list(cached.get("req_ids"))
    computed = _as_list(cached.get("num_computed_tokens"))
    outputs = _as_list(cached.get("num_output_tokens"))
    all_lens = cached.get("all_token_ids_lens")
    resumed = {str(r) for r in _as_list(cached.get("resumed_req_ids"))}
    rows = []
    for i, rid in enumerate(ids):
        rid_s = str(rid)
        n_computed = _as_int(computed[i]) if i < len(computed) else None
        n_output = _as_int(outputs[i]) if i < len(outputs) else None
        row: dict[str, Any] = {
            "request_id": rid_s,
            # A running request's prompt length is not in the dump; computed minus output
            # tokens is its lower bound, left to the reader: we report only what is printed.
            "prompt_len": None,
            "num_computed_tokens": n_computed,
            "num_output_tokens": n_output,
            "new": False,
        }
        if rid_s in resumed:
            row["resumed"] = True
        if isinstance(all_lens, dict) and rid_s in all_lens:
            row["all_token_ids_len"] = _as_int(all_lens[rid_s])
        rows.append(row)
    return rows


_SCALAR_KEYS = (
    "total_num_scheduled_tokens",
    "num_common_prefix_blocks",
    "finished_req_ids",
    "preempted_req_ids",
    "free_encoder_mm_hashes",
)


HISPARSE_METADATA = "HiSparseConnectorMetadata"
ROW_MIRROR = "SparseKVRowMirror"


def _find_call(value: Any, type_name: str, depth: int = 0) -> dict[str, Any] | None:
    """The first ``type_name(...)`` call inside a parsed value (MultiConnector nests it)."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, dict):
        if value.get("__type__") == type_name:
            return value
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return None
    for child in children:
        found = _find_call(child, type_name, depth + 1)
        if found is not None:
            return found
    return None


def _mirror_rows(metadata: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    """``row_mirrors`` of a parsed HiSparseConnectorMetadata -> {request id: rows, spans}.

    ``rows`` is the sum of the spans' ``num_rows``, None when a span's count is unreadable.
    """
    mirrors = metadata.get("row_mirrors")
    if not isinstance(mirrors, dict):
        return {}
    out: dict[str, dict[str, int | None]] = {}
    for rid, spans in mirrors.items():
        if rid == "__type__":
            continue
        items = [m for m in _as_list(spans) if isinstance(m, dict)]
        counts = [_as_int(m.get("num_rows")) for m in items]
        rows = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
        out[str(rid)] = {"rows": rows, "spans": len(items)}
    return out


def parse_row_mirrors(text: str) -> dict[str, Any]:
    """``...HiSparseConnectorMetadata(...)`` (its repr, or the dump's form) ->
    ``{"row_mirrors": {request id: {"rows", "spans"}}, "truncated"}``."""
    metadata, truncated = _call(text, HISPARSE_METADATA)
    return {"row_mirrors": _mirror_rows(metadata), "truncated": truncated}


def parse_scheduler_output(text: str) -> dict[str, Any]:
    """``...SchedulerOutput(...)`` -> ``{"requests": [...], "scheduler": {...}, "truncated"}``.

    One row per scheduled request: ``request_id``, ``prompt_len`` (``None`` for a running
    request, whose prompt length the dump does not print), ``num_computed_tokens``,
    ``num_output_tokens``, ``num_scheduled_tokens``, ``new`` (scheduled for the first time).
    With HiSparse metadata in the dump, each row also has ``mirror_rows`` (this step's host-mirror
    rows: 0 for a request without an entry, None where a cut dump leaves it unknown) and the
    result has ``row_mirrors`` (every entry, ``{"rows", "spans"}``).
    """
    out, truncated = _call(text, "SchedulerOutput")
    rows = [r for r in map(_new_request_row, _as_list(out.get("scheduled_new_reqs"))) if r]
    rows.extend(_cached_rows(out.get("scheduled_cached_reqs")))
    scheduled = out.get("num_scheduled_tokens")
    if isinstance(scheduled, dict):
        for row in rows:
            row["num_scheduled_tokens"] = _as_int(scheduled.get(row["request_id"]))
    scheduler = {k: out[k] for k in _SCALAR_KEYS if k in out}
    result: dict[str, Any] = {"requests": rows, "scheduler": scheduler, "truncated": truncated}
    metadata = _find_call(out.get("kv_connector_metadata"), HISPARSE_METADATA)
    if metadata is not None:
        mirrors = _mirror_rows(metadata)
        # A dump cut before the end of row_mirrors may have left a request's entry out.
        complete = not truncated or "all_context_pages_resident" in metadata
        for row in rows:
            entry = mirrors.get(row["request_id"])
            row["mirror_rows"] = entry["rows"] if entry is not None else (0 if complete else None)
        result["row_mirrors"] = mirrors
    return result


_STATS_ALIASES = {
    "num_running_reqs": "running",
    "num_waiting_reqs": "waiting",
    "num_skipped_waiting_reqs": "deferred",
    "kv_cache_usage": "kv_cache_usage",
    "step_counter": "step_counter",
    "current_wave": "current_wave",
}


def _plain(value: Any) -> Any:
    """Drop the ``__type__`` markers of nested calls, keep their fields."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "__type__"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse_scheduler_stats(text: str) -> dict[str, Any]:
    """``...SchedulerStats(...)`` -> a dict of its fields plus short aliases.

    Aliases: ``running``, ``waiting``, ``deferred``, ``kv_cache_usage`` (0..1),
    ``step_counter``, ``current_wave``; nested dataclasses (``prefix_cache_stats``) are dicts.
    """
    out, truncated = _call(text, "SchedulerStats")
    stats: dict[str, Any] = _plain(out)
    stats.pop("__args__", None)
    for name, alias in _STATS_ALIASES.items():
        if name in stats:
            stats[alias] = stats[name]
    stats["truncated"] = truncated
    return stats
