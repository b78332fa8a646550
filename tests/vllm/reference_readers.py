"""The per-step readers as they were before they kept state across steps: every column re-read
from vLLM's objects at every step. The oracle the stateful readers (``RequestColumns``,
``MirrorRows``, ``HostBlocks``) are checked against: for the same engine state at every step,
the same bytes."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

from collector.channel.codec import STATUS_CODE, UNKNOWN_STATUS

_NUM_ROWS = attrgetter("num_rows")
_IS_NULL = attrgetter("is_null")
_NONE: tuple[Any, ...] = ()


def status_code_of(status: Any) -> int:
    return STATUS_CODE.get(str(getattr(status, "name", status)).lower(), UNKNOWN_STATUS)


def request_columns(running: Sequence[Any]) -> dict[str, bytes]:
    """Every column of the running requests, read from them now."""
    return {
        "ids": "\0".join(str(r.request_id) for r in running).encode(),
        "prompt": array("I", [r.num_prompt_tokens for r in running]).tobytes(),
        "computed": array("I", [r.num_computed_tokens for r in running]).tobytes(),
        "output": array("I", [len(r._output_token_ids) for r in running]).tobytes(),
        "preempt": array("I", [r.num_preemptions for r in running]).tobytes(),
        "status": bytes(status_code_of(r.status) for r in running),
    }


def mirror_rows_column(ids: Sequence[str], row_mirrors: Mapping[str, Sequence[Any]] | None) -> bytes:
    if row_mirrors is None:
        return array("i", [-1]).tobytes() * len(ids)
    spans = map(row_mirrors.get, ids, repeat(_NONE))
    return array("i", map(sum, map(map, repeat(_NUM_ROWS), spans))).tobytes()


def host_blocks_column(req_to_blocks: Mapping[str, Sequence[Any]] | None, ids: Sequence[str]) -> bytes:
    if req_to_blocks is None:
        return array("i", [-1]).tobytes() * len(ids)
    lists = [req_to_blocks.get(i, _NONE) for i in ids]
    return array("i", [len(b) - sum(map(_IS_NULL, b)) for b in lists]).tobytes()
