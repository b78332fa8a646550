"""Internal: pure readers of vLLM's stats and request objects, duck-typed so they run (and are tested)
without vLLM.

vLLM documents ``SchedulerStats``, ``IterationStats`` and ``Request`` as unstable interfaces:
every field here is read with a default. A stats field that vanishes becomes null in the step
record (``collector.recorder.stats``), never 0; a ``Request`` field the per-request columns
cannot do without stops the recorder (``RecorderError``). What is read, as of vLLM 0.32:

- ``SchedulerStats``: num_running_reqs, num_waiting_reqs, num_skipped_waiting_reqs (deferred),
  num_kv_fetch_reqs_by_stage, step_counter, kv_cache_usage, prefix_cache_stats.{queries,hits},
  kv_connector_stats (``connector_stats``), connector_prefix_cache_stats, iteration_details
  (``--enable-logging-iteration-details``), cudagraph_stats (``--cudagraph-metrics``).
- ``IterationStats``: num_prompt_tokens, num_generation_tokens, num_preempted_reqs, and how many
  finished_requests (counted, not listed: each request's end reaches the sidecar once, in the
  scheduler's workload record; listing them cost a JSON encode in almost every step at load and
  a parse in the sidecar, which kept nothing of it: BENCHMARKS.md, "Where it stands").
- ``Request`` (engine core): request_id, num_prompt_tokens, num_computed_tokens,
  len(_output_token_ids) (else num_output_tokens), num_preemptions, status. Host-mirror rows and
  host blocks are not on the Request: ``collector.vllm.hisparse``.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from collector.channel.wire import STATUS_CODE, UNKNOWN_STATUS
from collector.errors import FlightrecError

# What each connector's stat lists mean (vLLM 0.32/0.33: hisparse/stats.py, nixl/stats.py).
# Levels: gauges, the last observation is the value (vLLM's own aggregate keeps only the last).
# Deltas: counts since the previous report, summed. Any other list is samples (durations,
# sizes): count, sum and max.
LEVELS = {"HiSparseConnector": frozenset({"host_cache_usage_perc", "pending_page_transfers"})}
DELTAS = {
    "HiSparseConnector": frozenset({"cache_hits", "cache_misses", "host_to_device_bytes"}),
    "NixlConnector": frozenset(
        {
            "num_failed_transfers",
            "num_failed_notifications",
            "num_failed_handshakes",
            "num_kv_expired_reqs",
            "num_notifications_after_expiry",
        }
    ),
}
_EMPTY: frozenset[str] = frozenset()
_MAX_DEPTH = 6


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def connector_stats(stats: Mapping[str, Any], *, connector: str | None = None) -> dict[str, Any]:
    """``SchedulerStats.kv_connector_stats`` as one flat dict, keyed ``<connector>.<stat>``.

    MultiConnector's stats are already keyed by connector class name; a single connector's
    are not, so ``connector`` (its configured class name) names them. Each list is reduced by
    its meaning (``LEVELS``, ``DELTAS``, else samples: ``.count``/``.sum``/``.max``). A level or
    a delta with no observation this step is left out: absent means not reported, not 0.
    """
    if connector and connector != "MultiConnector" and not any(isinstance(v, Mapping) for v in stats.values()):
        stats = {connector: stats}
    out: dict[str, Any] = {}

    def walk(prefix: str, owner: str, value: Any, depth: int) -> None:
        if isinstance(value, Mapping) and depth < _MAX_DEPTH:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), owner or str(k), v, depth + 1)
            return
        leaf = prefix.rsplit(".", 1)[-1]
        if isinstance(value, (list, tuple)):
            nums = [v for v in value if _number(v)]
            if len(nums) != len(value):
                out[prefix] = str(value)[:200]
            elif leaf in LEVELS.get(owner, _EMPTY):
                if nums:
                    out[prefix] = nums[-1]
            elif leaf in DELTAS.get(owner, _EMPTY):
                if nums:
                    out[prefix] = sum(nums)
            else:
                out[f"{prefix}.count"] = len(nums)
                if nums:
                    out[f"{prefix}.sum"] = sum(nums)
                    out[f"{prefix}.max"] = max(nums)
            return
        if value is None or isinstance(value, (bool, str)) or _number(value):
            out[prefix] = value
        else:
            out[prefix] = str(value)[:200]

    walk("", "", stats, 0)
    return out


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


def step_extras(s: Any, *, connector: str | None = None) -> dict[str, Any] | None:
    """The JSON part of a step record: what only some steps have (``collector.recorder.stats``).
    ``connector``: the configured connector's class name (``kv_transfer_config.kv_connector``)."""
    extras: dict[str, Any] = {}
    kvc = getattr(s, "kv_connector_stats", None)
    if kvc:
        extras["connector"] = connector_stats(kvc, connector=connector)
    fetch = getattr(s, "num_kv_fetch_reqs_by_stage", None)
    if fetch and any(fetch.values()):
        extras["waiting_by_reason"] = {f"kv_fetch_{k}": v for k, v in fetch.items()}
    ext = getattr(s, "connector_prefix_cache_stats", None)  # prefixes offered by the KV connector
    queries: Any = getattr(ext, "queries", None)
    if queries:  # only steps that asked the connector
        extras["external_prefix_cache"] = {"queries": queries, "hits": getattr(ext, "hits", None)}
    details = getattr(s, "iteration_details", None)  # --enable-logging-iteration-details
    if details is not None:
        extras["iteration"] = _plain(details)
    graphs = getattr(s, "cudagraph_stats", None)  # --cudagraph-metrics
    if graphs is not None:
        extras["cudagraph"] = _plain(graphs)
    return extras or None


class RecorderError(FlightrecError, RuntimeError):
    """vLLM's objects lack a field the recorder cannot do without: it stops, rather than write
    made-up values."""


class _StatusCodes(dict[Any, int]):
    """vLLM status -> our wire code, learnt per status value on first sight."""

    def __missing__(self, status: Any) -> int:
        name = str(getattr(status, "name", status)).lower()
        code = STATUS_CODE.get(name, UNKNOWN_STATUS)
        self[status] = code
        return code


REQUIRED = ("request_id", "num_prompt_tokens", "num_computed_tokens", "num_preemptions", "status")


_SPLICE_MAX = 16  # requests taken out of the running list (or stretches kept) a splice follows; more: read again
# A shorter list is read again whole: there the splice's bookkeeping costs more than the reads
# it saves (bench/bench_recorder.py, per_request_churn: 11.7 us against 8.6 at 16 running, even
# at 64, 51 against 71 at 256).
_SPLICE_FROM = 64


def _common(a: list[Any], at_a: int, b: list[Any], at_b: int, most: int) -> int:
    """How many requests ``a`` from ``at_a`` and ``b`` from ``at_b`` have in common (the same
    objects) before the first that differs, at most ``most``: a bisection of list-slice
    comparisons (C loops that compare pointers first; a ``Request`` has no ``__eq__``)."""
    if a[at_a] is not b[at_b]:
        return 0
    if a[at_a : at_a + most] == b[at_b : at_b + most]:
        return most
    lo, hi = 1, most  # lo requests are the same; hi are not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[at_a + lo : at_a + mid] == b[at_b + lo : at_b + mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RequestColumns:
    """Reads the running requests of a step column by column, for one ``R`` record.

    Only computed and output tokens are read every step, and only those: the rest (id, prompt
    length, preemptions, status) is re-read only when the running list changes. vLLM takes a
    request out of ``running`` when it preempts or finishes it, so while the list holds the same
    requests in the same order, their preemption counts and statuses cannot have changed. A
    caller that knows of a preemption anyway passes ``changed=True``.

    When a list of ``_SPLICE_FROM`` or more changes by requests taken out and others appended
    (requests finishing and joining: most steps of a loaded engine), the rows of those still in it are kept
    and only the appended ones are read (``_splice``): at 256 running, one request gone and one
    appended at every step, the whole step costs 51 us against 71 when every change read all
    of them again (``bench/bench_recorder.py``, ``per_request_churn``).

    The two per-step reads are one list comprehension each (the interpreter's specialised
    attribute load beats ``map`` over an ``attrgetter`` by a third) into an ``array``. The output
    count is ``len`` of each request's output-token list, and the lists themselves are held
    from the last change of the running set: ``Request`` builds that list once and wraps it in
    the ``ConstantList`` it hands out (vllm/v1/request.py:146,193 in vLLM 0.32), so it is the same
    list for the request's life.

    A ``Request`` without one of ``REQUIRED`` (a vLLM that renamed it) raises
    ``RecorderError``: the recorder stops and says why, it never writes zeros in its place.
    """

    def __init__(self) -> None:
        self._prev: list[Any] | None = None
        self.ids = b""
        self.id_list: list[str] = []
        self.prompt = b""
        self.preempt = b""
        self.status = b""
        self._codes = _StatusCodes()
        self._outputs: list[Any] = []  # each running request's output-token list
        self._output_len = True

    def _probe(self, req: Any) -> None:
        # Which fields this vLLM's Request has: decided once per new running set.
        missing = [name for name in REQUIRED if not hasattr(req, name)]
        self._output_len = hasattr(req, "_output_token_ids")
        if not self._output_len and not hasattr(req, "num_output_tokens"):
            missing.append("num_output_tokens")
        if missing:
            raise RecorderError(f"vLLM's Request has no {', '.join(missing)}")

    def _splice(self, running: Sequence[Any]) -> bool:
        """Refresh the cached columns from the last ones where the new running list is the last
        one with a few requests taken out and others appended (a step where requests finish and
        join: most steps at load); False where it is not (a reorder, many taken out, the first
        list), and nothing is changed. A request in both lists keeps its rows; the appended ones
        are read. The lists are matched by the requests' identities: stretches in common are
        found by bisecting with slice comparisons, not row by row."""
        prev = self._prev
        if not prev or not running:
            return False
        new = list(running)
        n_old, n_new = len(prev), len(running)
        spans: list[tuple[int, int]] = []  # stretches of the last list kept, in order: [start, end)
        i = j = 0
        while i < n_old and j < n_new:
            length = _common(prev, i, new, j, min(n_old - i, n_new - j))
            if length:
                spans.append((i, i + length))
                i += length
                j += length
            if i < n_old and j < n_new:  # the last list's request at i is not the new one's at j: gone
                i += 1
                if i - j > _SPLICE_MAX or len(spans) > _SPLICE_MAX:
                    return False
        added = running[j:]
        self._prev = new
        if added:
            self._probe(added[0])
        new_ids = [r.request_id for r in added]
        id_list: list[str] = []
        outputs: list[Any] = []
        for a, b in spans:  # (list slices: C copies)
            id_list += self.id_list[a:b]
            if self._output_len:
                outputs += self._outputs[a:b]
        try:
            joined = "\0".join(id_list + new_ids)
        except TypeError:
            new_ids = list(map(str, new_ids))
            joined = "\0".join(id_list + new_ids)
        self.id_list = id_list + new_ids
        self.ids = joined.encode()
        prompt = array("I")
        prompt.fromlist([r.num_prompt_tokens for r in added])
        preempt = array("I")
        preempt.fromlist([r.num_preemptions for r in added])
        status = bytes(map(self._codes.__getitem__, [r.status for r in added]))
        self.prompt = b"".join([self.prompt[4 * a : 4 * b] for a, b in spans] + [prompt.tobytes()])
        self.preempt = b"".join([self.preempt[4 * a : 4 * b] for a, b in spans] + [preempt.tobytes()])
        self.status = b"".join([self.status[a:b] for a, b in spans] + [status])
        if self._output_len:
            self._outputs = outputs + [r._output_token_ids for r in added]
        return True

    def _refresh(self, running: Sequence[Any]) -> None:
        # One comprehension a column (the interpreter's specialised attribute load): half the
        # time of ``map`` over an ``attrgetter`` into ``array``, which matters where the running
        # set changes at every step (a request finishing or joining: bench_recorder.py's
        # ``per_request_churn``).
        self._prev = list(running)
        if running:
            self._probe(running[0])
        ids = [r.request_id for r in running]
        try:
            joined = "\0".join(ids)
        except TypeError:  # (vLLM's ids are str; any other kind is written as its str)
            ids = list(map(str, ids))
            joined = "\0".join(ids)
        self.id_list = ids
        self.ids = joined.encode()
        prompt = array("I")
        prompt.fromlist([r.num_prompt_tokens for r in running])
        self.prompt = prompt.tobytes()
        preempt = array("I")
        preempt.fromlist([r.num_preemptions for r in running])
        self.preempt = preempt.tobytes()
        statuses = [r.status for r in running]
        # a running list holds running requests: one code for all, without hashing each status
        # (an Enum's hash is a Python call)
        if statuses and statuses.count(statuses[0]) == len(statuses):
            self.status = bytes((self._codes[statuses[0]],)) * len(statuses)
        else:
            self.status = bytes(map(self._codes.__getitem__, statuses))
        self._outputs = [r._output_token_ids for r in running] if self._output_len else []

    def read(self, running: Sequence[Any], *, changed: bool = False) -> tuple[bytes, bytes]:
        """Refresh the cached columns when needed; return this step's (computed, output)."""
        both = self.counts(running, changed=changed)
        half = len(both) // 2
        return both[:half], both[half:]

    def counts(self, running: Sequence[Any], *, changed: bool = False) -> bytes:
        """``read`` as one buffer: this step's computed column then its output column, the two
        columns the ``R`` record has side by side, built as one ``array`` (one ``bytes`` a step,
        not two)."""
        if changed or running != self._prev:
            if changed or len(running) < _SPLICE_FROM or not self._splice(running):
                self._refresh(running)
        column = array("I")  # fromlist reads a list a quarter faster than the constructor
        column.fromlist([r.num_computed_tokens for r in running])
        if self._output_len:
            column.fromlist(list(map(len, self._outputs)))
        else:
            column.fromlist([r.num_output_tokens for r in running])
        return column.tobytes()
