"""The pure readers of vLLM objects, over stand-ins shaped like vLLM 0.32's (the same readers
run against the real classes in test_inside_vllm.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.channel.codec import encode_request_columns
from collector.vllm import extract
from collector.vllm.extract import RecorderError, RequestColumns, connector_stats, step_extras
from tests.request_columns import Row
from tests.request_columns import rows_of as decoded_rows

SPLICE_FROM = extract._SPLICE_FROM


class Status(enum.IntEnum):  # vLLM's numbering differs; the wire code is by name
    WAITING = 1
    RUNNING = 5
    PREEMPTED = 6


@dataclass(eq=False)
class Req:
    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    status: Status = Status.RUNNING
    _output_token_ids: list[int] = field(default_factory=list)


def rows_of(cols: RequestColumns, running: list[Any], *, changed: bool = False) -> list[Row]:
    computed, output = cols.read(running, changed=changed)
    return decoded_rows(encode_request_columns(1, 0.0, len(running), cols.ids, cols.prompt, computed, output, cols.preempt, cols.status))


def test_columns_follow_the_requests_step_by_step() -> None:
    reqs = [Req("a", 300, 300), Req("b", 40, 12)]
    cols = RequestColumns()
    assert rows_of(cols, reqs) == [Row("a", 300, 300), Row("b", 40, 12)]
    for r in reqs:  # a decode step
        r.num_computed_tokens += 1
        r._output_token_ids.append(5)
    assert rows_of(cols, reqs) == [Row("a", 300, 301, 1), Row("b", 40, 13, 1)]


def test_a_changed_running_list_rereads_ids_and_preemptions() -> None:
    a, b, c = Req("a", 3, 3), Req("b", 4, 4), Req("c", 5, 0, num_preemptions=2)
    running = [a, b]
    cols = RequestColumns()
    rows_of(cols, running)
    running.remove(b)  # b preempted: vLLM takes it out of running
    running.append(c)  # c resumes
    rows = rows_of(cols, running)
    assert [(r.request_id, r.prompt_len, r.preemptions) for r in rows] == [("a", 3, 0), ("c", 5, 2)]


def test_changed_flag_forces_a_reread() -> None:
    a = Req("a", 3, 3)
    cols = RequestColumns()
    rows_of(cols, [a])
    a.num_preemptions, a.status = 1, Status.PREEMPTED
    assert rows_of(cols, [a])[0].preemptions == 0  # same list: cached
    row = rows_of(cols, [a], changed=True)[0]
    assert (row.preemptions, row.status) == (1, "preempted")


def test_a_request_without_a_required_field_stops_the_recorder_not_zeros() -> None:
    @dataclass(eq=False)
    class Sparse:
        request_id: str
        num_computed_tokens: int

    with pytest.raises(RecorderError, match="num_prompt_tokens"):
        RequestColumns().read([Sparse("a", 9)])


def test_no_running_requests() -> None:
    assert rows_of(RequestColumns(), []) == []


@pytest.mark.parametrize(
    ("stats", "connector", "expected"),
    [
        # a single NixlConnector: its stats are not keyed by connector, the config names it
        (
            {"num_failed_transfers": [1, 1], "transfer_duration": [0.1, 0.3]},
            "NixlConnector",
            {
                "NixlConnector.num_failed_transfers": 2,
                "NixlConnector.transfer_duration.count": 2,
                "NixlConnector.transfer_duration.sum": 0.4,
                "NixlConnector.transfer_duration.max": 0.3,
            },
        ),
        # MultiConnector: keyed by connector; HiSparse levels keep the last, deltas are summed,
        # a level or delta with no observation is absent (not 0); samples give count/sum/max
        (
            {
                "NixlConnector": {"num_failed_transfers": []},
                "HiSparseConnector": {
                    "cache_hits": [],
                    "cache_misses": [3, 4],
                    "host_to_device_bytes": [10],
                    "host_cache_usage_perc": [0.2, 0.25],
                    "pending_page_transfers": [7, 5],
                    "host_block_lifetime_seconds": [1.0, 3.0],
                },
            },
            "MultiConnector",
            {
                "HiSparseConnector.cache_misses": 7,
                "HiSparseConnector.host_to_device_bytes": 10,
                "HiSparseConnector.host_cache_usage_perc": 0.25,
                "HiSparseConnector.pending_page_transfers": 5,
                "HiSparseConnector.host_block_lifetime_seconds.count": 2,
                "HiSparseConnector.host_block_lifetime_seconds.sum": 4.0,
                "HiSparseConnector.host_block_lifetime_seconds.max": 3.0,
            },
        ),
        ({"Other": {"empty": [], "odd": object}}, None, {"Other.empty.count": 0, "Other.odd": str(object)}),
    ],
)
def test_connector_stats_by_connector_and_meaning(stats: dict[str, Any], connector: str | None, expected: dict[str, Any]) -> None:
    out = connector_stats(stats, connector=connector)
    assert out.keys() == expected.keys()
    for k, v in expected.items():
        assert out[k] == pytest.approx(v) if isinstance(v, float) else out[k] == v


def test_step_extras_carry_iteration_details_and_cudagraph_use() -> None:
    @dataclass
    class Details:
        iteration_index: int = 9
        num_ctx_requests: int = 1
        num_generation_tokens: int = 15
        elapsed_ms: float = 24.5

    @dataclass(frozen=True)
    class Graph:
        num_unpadded_tokens: int = 15
        num_padded_tokens: int = 16
        num_paddings: int = 1
        runtime_mode: str = "FULL"

    s = SimpleNamespace(
        iteration_details=Details(),
        cudagraph_stats=Graph(),
        kv_connector_stats=None,
        num_kv_fetch_reqs_by_stage={"in_progress": 0},
        connector_prefix_cache_stats=SimpleNamespace(queries=640, hits=600),
    )
    assert step_extras(s) == {
        "external_prefix_cache": {"queries": 640, "hits": 600},
        "iteration": {"iteration_index": 9, "num_ctx_requests": 1, "num_generation_tokens": 15, "elapsed_ms": 24.5},
        "cudagraph": {"num_unpadded_tokens": 15, "num_padded_tokens": 16, "num_paddings": 1, "runtime_mode": "FULL"},
    }
    assert step_extras(SimpleNamespace()) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["finish", "finish", "join", "join", "pop", "swap", "same", "clear"]), st.integers(0, 10**6)), max_size=30))
def test_a_running_list_that_changes_reads_as_a_fresh_read_of_it(edits: list[tuple[str, int]]) -> None:
    """Requests finishing anywhere, joining at the end, preempted off the end, reordered, all
    gone: step after step the columns (kept from the last step where a request stayed) are those
    a first read of the same list makes."""
    made = [0]

    def new() -> Req:
        made[0] += 1
        m = made[0]
        status = Status.RUNNING if m % 4 else Status.WAITING
        return Req(f"req-{m}", 10 + m % 7, m % 5, num_preemptions=m % 3, status=status, _output_token_ids=[1] * (m % 4))

    running = [new() for _ in range(5)]
    cols = RequestColumns()
    extract._SPLICE_FROM = 0  # (short lists spliced too, here)
    try:
        check(cols, running, edits, new)
    finally:
        extract._SPLICE_FROM = SPLICE_FROM


def check(cols: RequestColumns, running: list[Req], edits: list[tuple[str, int]], new: Any) -> None:
    for what, k in edits:
        if what == "finish" and running:
            running.pop(k % len(running))
        elif what == "join":
            running += [new() for _ in range(1 + k % 3)]
        elif what == "pop" and running:
            del running[-(1 + k % min(3, len(running))) :]
        elif what == "swap" and len(running) > 1:
            i, j = k % len(running), (k // 7) % len(running)
            running[i], running[j] = running[j], running[i]
        elif what == "clear":
            running = []
        for r in running:  # a decode step
            r.num_computed_tokens += 1
            r._output_token_ids.append(2)
        assert rows_of(cols, list(running)) == rows_of(RequestColumns(), list(running))
