"""Followed files' reads made together: those asked for in one pass of the loop run in one worker
call, each caller gets its own result or its own error."""

from __future__ import annotations

import asyncio
import threading

import pytest

from collector.sources import batched_reads
from collector.sources.batched_reads import read_in_thread


def test_reads_asked_in_one_pass_run_in_one_worker_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = batched_reads._read_all

    def counted(reads: list) -> list:  # type: ignore[type-arg]
        calls.append(len(reads))
        return real(reads)

    monkeypatch.setattr(batched_reads, "_read_all", counted)
    loop_thread = threading.get_ident()

    async def main() -> list[tuple[int, int]]:
        def read(i: int) -> tuple[int, int]:
            return i, threading.get_ident()

        first = await asyncio.gather(*(read_in_thread(lambda i=i: read(i)) for i in range(8)))
        second = await asyncio.gather(*(read_in_thread(lambda i=i: read(i)) for i in range(3)))
        return [*first, *second]

    out = asyncio.run(main())
    assert [i for i, _ in out] == [*range(8), *range(3)]
    assert all(tid != loop_thread for _, tid in out)  # never on the loop's thread
    assert calls == [8, 3]


def test_a_read_that_fails_fails_its_own_caller_only() -> None:
    def broken() -> str:
        raise OSError("gone")

    async def main() -> list[object]:
        return await asyncio.gather(read_in_thread(lambda: "a"), read_in_thread(broken), read_in_thread(lambda: "c"), return_exceptions=True)

    a, b, c = asyncio.run(main())
    assert a == "a" and c == "c"
    assert isinstance(b, OSError) and str(b) == "gone"


def test_a_caller_cancelled_while_its_read_runs_leaves_the_others_their_results() -> None:
    gate = threading.Event()

    def slow() -> str:
        gate.wait(5)
        return "slow"

    async def main() -> tuple[str, bool]:
        other = asyncio.create_task(read_in_thread(slow))
        mine = asyncio.create_task(read_in_thread(lambda: "mine"))
        await asyncio.sleep(0.05)
        mine.cancel()
        gate.set()
        await asyncio.gather(mine, return_exceptions=True)
        return await other, mine.cancelled()

    value, cancelled = asyncio.run(main())
    assert value == "slow" and cancelled


def test_a_read_whose_caller_was_cancelled_before_it_started_is_not_made() -> None:
    made: list[str] = []

    async def main() -> str:
        gone = asyncio.create_task(read_in_thread(lambda: made.append("gone") or "gone"))
        kept = asyncio.create_task(read_in_thread(lambda: made.append("kept") or "kept"))
        await asyncio.sleep(0)  # both asked, in this pass; the batch starts in the next
        gone.cancel()
        return await kept

    assert asyncio.run(main()) == "kept"
    assert made == ["kept"]
