"""The pure readers of vLLM objects, over stand-ins shaped like vLLM 0.32's (the same readers
run against the real classes in test_inside_vllm.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import pytest

from collector.channel.codec import decode, encode_request_columns
from collector.model import RequestRow
from collector.vllm.extract import RecorderError, RequestColumns, finished_row, flatten_connector


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


def rows_of(cols: RequestColumns, running: list[Any], *, changed: bool = False) -> list[RequestRow]:
    computed, output = cols.read(running, changed=changed)
    payload = encode_request_columns(
        1, 0.0, len(running), cols.ids, cols.prompt, computed, output, cols.preempt, cols.status
    )
    _, step = decode(payload)
    assert step is not None and step.requests is not None
    return step.requests


def test_columns_follow_the_requests_step_by_step() -> None:
    reqs = [Req("a", 300, 300), Req("b", 40, 12)]
    cols = RequestColumns()
    assert rows_of(cols, reqs) == [RequestRow("a", 300, 300), RequestRow("b", 40, 12)]
    for r in reqs:  # a decode step
        r.num_computed_tokens += 1
        r._output_token_ids.append(5)
    assert rows_of(cols, reqs) == [RequestRow("a", 300, 301, 1), RequestRow("b", 40, 13, 1)]


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
    ("stats", "expected"),
    [
        ({"num_successful_transfers": 3, "transfer_duration": [0.1, 0.3]},
         {"num_successful_transfers": 3, "transfer_duration.count": 2, "transfer_duration.sum": 0.4,
          "transfer_duration.max": 0.3}),
        ({"NixlConnector": {"num_failed_transfers": 1}, "HiSparseConnector": {"mirror_rows": 12, "pending": 2}},
         {"NixlConnector.num_failed_transfers": 1, "HiSparseConnector.mirror_rows": 12,
          "HiSparseConnector.pending": 2, "mirror_rows": 12}),
        ({"empty": [], "odd": object}, {"empty.count": 0, "odd": str(object)}),
    ],
)  # fmt: skip
def test_flatten_connector(stats: dict[str, Any], expected: dict[str, Any]) -> None:
    out = flatten_connector(stats)
    assert out.keys() == expected.keys()
    for k, v in expected.items():
        assert out[k] == pytest.approx(v) if isinstance(v, float) else out[k] == v


def test_finished_row() -> None:
    class Reason(enum.IntEnum):
        LENGTH = 1

    @dataclass
    class Fin:
        finish_reason: Reason
        request_id: str = "cmpl-1"
        e2e_latency: float = 1.5
        num_prompt_tokens: int = 300

    assert finished_row(Fin(Reason.LENGTH)) == {
        "request_id": "cmpl-1", "e2e_latency": 1.5, "num_prompt_tokens": 300, "finish_reason": "length",
    }  # fmt: skip
