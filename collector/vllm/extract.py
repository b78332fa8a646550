"""Pure readers of vLLM's stats and request objects, duck-typed so they run (and are tested)
without vLLM.

vLLM documents ``SchedulerStats``, ``IterationStats`` and ``Request`` as unstable interfaces:
every field here is read with a default, and a field that vanishes in a later vLLM makes its
column zero (or absent), not the recorder fail. What is read, as of vLLM 0.32:

- ``SchedulerStats``: num_running_reqs, num_waiting_reqs, num_skipped_waiting_reqs (deferred),
  num_kv_fetch_reqs_by_stage, step_counter, kv_cache_usage, prefix_cache_stats.{queries,hits},
  kv_connector_stats (a dict; nested per connector under MultiConnector).
- ``IterationStats``: num_prompt_tokens, num_generation_tokens, num_preempted_reqs,
  finished_requests (``FinishedRequestStats``).
- ``Request`` (engine core): request_id, num_prompt_tokens, num_computed_tokens,
  len(_output_token_ids) (else num_output_tokens), num_preemptions, status, and the first of
  ``MIRROR_ROW_ATTRS`` that exists (host-mirror rows of a sparse-attention connector; vLLM 0.32
  has no such connector, so the column is absent there).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from collector.channel.codec import STATUS_CODE, UNKNOWN_STATUS

MIRROR_ROW_ATTRS = ("num_mirror_rows", "mirror_rows", "hisparse_mirror_rows", "num_host_mirror_rows")
MIRROR_KEYS = ("mirror_rows", "num_mirror_rows", "host_mirror_rows")
FINISHED_FIELDS = (
    "request_id", "e2e_latency", "num_prompt_tokens", "num_generation_tokens", "num_preemptions",
    "num_cached_tokens", "queued_time", "prefill_time", "decode_time", "inference_time",
    "max_tokens_param",
)  # fmt: skip
_MAX_DEPTH = 6


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flatten_connector(stats: Mapping[str, Any]) -> dict[str, Any]:
    """``kv_connector_stats`` as one flat dict of scalars.

    Nested dicts (MultiConnector's per-connector stats) become dotted keys; a list of numbers
    (NIXL's per-transfer durations, for example) becomes ``.count``, ``.sum`` and ``.max``; any
    key that names host-mirror rows is also summed into ``mirror_rows``.
    """
    out: dict[str, Any] = {}
    mirror = 0
    found_mirror = False

    def walk(prefix: str, value: Any, depth: int) -> None:
        nonlocal mirror, found_mirror
        if isinstance(value, Mapping) and depth < _MAX_DEPTH:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, depth + 1)
            return
        leaf = prefix.rsplit(".", 1)[-1]
        if isinstance(value, (list, tuple)):
            nums = [v for v in value if _number(v)]
            if len(nums) == len(value):
                out[f"{prefix}.count"] = len(nums)
                if nums:
                    out[f"{prefix}.sum"] = sum(nums)
                    out[f"{prefix}.max"] = max(nums)
                return
            out[prefix] = str(value)[:200]
            return
        if value is None or isinstance(value, (bool, str)) or _number(value):
            out[prefix] = value
        else:
            out[prefix] = str(value)[:200]
        if leaf in MIRROR_KEYS and _number(value):
            mirror += int(value)
            found_mirror = True

    walk("", stats, 0)
    if found_mirror:
        out["mirror_rows"] = mirror
    return out


def finished_row(stats: Any) -> dict[str, Any]:
    """One ``FinishedRequestStats`` as a plain dict (fields that exist)."""
    row: dict[str, Any] = {}
    for name in FINISHED_FIELDS:
        value = getattr(stats, name, None)
        if value is not None:
            row[name] = value
    reason = getattr(stats, "finish_reason", None)
    if reason is not None:
        row["finish_reason"] = str(getattr(reason, "name", reason)).lower()
    return row


def _plain(obj: Any) -> dict[str, Any] | None:
    """A small stats dataclass (vLLM's ``SchedulerIterationDetails``, ``CUDAGraphStat``) as a
    dict of its scalar fields."""
    if obj is None:
        return None
    fields = getattr(obj, "__dataclass_fields__", None)
    names = list(fields) if fields else [n for n in vars(obj) if not n.startswith("_")]
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name, None)
        if value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(getattr(value, "name", value))
    return out


def step_extras(s: Any, finished: Sequence[Any]) -> dict[str, Any] | None:
    """The JSON part of a step record: what only some steps have (``collector.recorder.stats``)."""
    extras: dict[str, Any] = {}
    kvc = getattr(s, "kv_connector_stats", None)
    if kvc:
        extras["connector"] = flatten_connector(kvc)
    if finished:
        extras["finished_requests"] = [finished_row(f) for f in finished]
    fetch = getattr(s, "num_kv_fetch_reqs_by_stage", None)
    if fetch and any(fetch.values()):
        extras["waiting_by_reason"] = {f"kv_fetch_{k}": v for k, v in fetch.items()}
    details = getattr(s, "iteration_details", None)  # --enable-logging-iteration-details
    if details is not None:
        extras["iteration"] = _plain(details)
    graphs = getattr(s, "cudagraph_stats", None)  # --cudagraph-metrics
    if graphs is not None:
        extras["cudagraph"] = _plain(graphs)
    return extras or None


class RecorderError(RuntimeError):
    """vLLM's objects lack a field the recorder cannot do without: it stops, rather than write
    made-up values."""


class _StatusCodes(dict[Any, int]):
    """vLLM status -> our wire code, learnt per status value on first sight."""

    def __missing__(self, status: Any) -> int:
        name = str(getattr(status, "name", status)).lower()
        code = STATUS_CODE.get(name, UNKNOWN_STATUS)
        self[status] = code
        return code


_ID = attrgetter("request_id")
_PROMPT = attrgetter("num_prompt_tokens")
_COMPUTED = attrgetter("num_computed_tokens")
_OUTPUT_LIST = attrgetter("_output_token_ids")
_OUTPUT = attrgetter("num_output_tokens")
_PREEMPT = attrgetter("num_preemptions")
_STATUS = attrgetter("status")
REQUIRED = ("request_id", "num_prompt_tokens", "num_computed_tokens", "num_preemptions", "status")


class RequestColumns:
    """Reads the running requests of a step column by column, for one ``R`` record.

    Every column is read with ``map`` over an ``attrgetter`` (the loop runs in C). Only
    computed and output tokens are read every step. The rest (id, prompt length, preemptions,
    status) is re-read only when the running list changes: vLLM takes a request out of
    ``running`` when it preempts or finishes it, so while the list holds the same requests in
    the same order, their preemption counts and statuses cannot have changed. A caller that
    knows of a preemption anyway passes ``changed=True``.

    A ``Request`` without one of ``REQUIRED`` (a vLLM that renamed it) raises
    ``RecorderError``: the recorder stops and says why, it never writes zeros in its place.
    """

    def __init__(self) -> None:
        self._prev: list[Any] | None = None
        self.ids = b""
        self.prompt = b""
        self.preempt = b""
        self.status = b""
        self._codes = _StatusCodes()
        self._output: Any = _OUTPUT_LIST
        self._output_len = True

    def _probe(self, req: Any) -> None:
        # Which fields this vLLM's Request has: decided once per new running set.
        missing = [name for name in REQUIRED if not hasattr(req, name)]
        self._output_len = hasattr(req, "_output_token_ids")
        self._output = _OUTPUT_LIST if self._output_len else _OUTPUT
        if not self._output_len and not hasattr(req, "num_output_tokens"):
            missing.append("num_output_tokens")
        if missing:
            raise RecorderError(f"vLLM's Request has no {', '.join(missing)}")

    def _refresh(self, running: Sequence[Any]) -> None:
        self._prev = list(running)
        if running:
            self._probe(running[0])
        self.ids = "\0".join(map(str, map(_ID, running))).encode()
        self.prompt = array("I", map(_PROMPT, running)).tobytes()
        self.preempt = array("I", map(_PREEMPT, running)).tobytes()
        self.status = bytes(map(self._codes.__getitem__, map(_STATUS, running)))

    def read(self, running: Sequence[Any], *, changed: bool = False) -> tuple[bytes, bytes]:
        """Refresh the cached columns when needed; return this step's (computed, output)."""
        if changed or running != self._prev:
            self._refresh(running)
        computed = array("I", map(_COMPUTED, running)).tobytes()
        if self._output_len:
            output = array("I", map(len, map(_OUTPUT_LIST, running))).tobytes()
        else:
            output = array("I", map(_OUTPUT, running)).tobytes()
        return computed, output
