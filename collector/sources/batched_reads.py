"""Internal: the blocking reads that followed files need, made for every follower together in one
worker thread per pass of the event loop.

Each engine's log is read in a worker thread (a read must never hold the loop), every
``log_poll_interval``, on the loop's shared ticks (``collector.ticks``). With one
``asyncio.to_thread`` per follower, a node of 8 quiet logs cost 8 thread hand-offs and their 8
hand-backs each tick, about 1% of a core on a 2-vCPU VM (``bench/bench_wakes.py``). The followers
wake on the same tick, so ``read_in_thread`` gathers the reads asked for in one pass of the loop
and makes them in a single worker call: one hand-off and one hand-back a tick, whatever the number
of files. A read that raises fails its own caller only. A read that hangs (a dead network mount)
holds up the other followers' reads until it returns, never the loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["read_in_thread"]

T = TypeVar("T")

_Pending = list[tuple[Callable[[], Any], "asyncio.Future[Any]"]]
_PENDING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pending] = weakref.WeakKeyDictionary()


async def read_in_thread(read: Callable[[], T]) -> T:
    """``read()`` in a worker thread, with the other reads asked for in this pass of the loop."""
    loop = asyncio.get_running_loop()
    pending = _PENDING.get(loop)
    if pending is None:
        pending = _PENDING[loop] = []
    if not pending:
        loop.call_soon(_start, loop)  # after the other callbacks of this pass have asked
    result: asyncio.Future[T] = loop.create_future()
    pending.append((read, result))
    return await result


def _start(loop: asyncio.AbstractEventLoop) -> None:
    # a read whose caller was cancelled meanwhile is not made (its follower may be closing it)
    batch = [(read, result) for read, result in _PENDING.pop(loop, []) if not result.done()]
    if not batch:
        return
    try:
        work = loop.run_in_executor(None, _read_all, [read for read, _ in batch])
    except RuntimeError as exc:  # no executor any more (the loop is shutting down): said to each
        for _, result in batch:
            result.set_exception(exc)
        return
    work.add_done_callback(lambda done: _deliver(done, [result for _, result in batch]))


def _read_all(reads: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    out: list[tuple[bool, Any]] = []
    for read in reads:
        try:
            out.append((True, read()))
        except Exception as exc:  # the caller's own failure, raised where it awaits
            out.append((False, exc))
    return out


def _deliver(done: asyncio.Future[list[tuple[bool, Any]]], results: list[asyncio.Future[Any]]) -> None:
    if done.cancelled():
        for result in results:
            result.cancel()
        return
    error = done.exception()
    outcomes = done.result() if error is None else [(False, error)] * len(results)
    for result, (ok, value) in zip(results, outcomes, strict=True):
        if result.done():  # its caller was cancelled meanwhile
            continue
        if ok:
            result.set_result(value)
        else:
            result.set_exception(value)
