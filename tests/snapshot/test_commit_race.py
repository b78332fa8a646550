"""A snapshot held back until the stop: the build of a capture (in a worker thread) walked the
trigger event's ``data`` while the loop merged a second witness of the same Xid into it.

``asdict`` (``Event.to_dict``) iterates a dict in Python, one item at a time: a key the loop adds
meanwhile (``XidMerger`` copies the NVML report's fields into the kernel's event, the committer
writes ``snapshot_id`` into shared events) ends the walk with ``RuntimeError: dictionary changed
size during iteration``. The committer logged it, dropped the job, scheduled no amendment (that
comes after a successful build), and the only thing left to commit the fault was the stop's
drain: the demo's snapshot committed 101 s after its Xid, when its 120 s wait ran out.

The gate below makes the interleaving deterministic: the build thread stops inside the walk of
the trigger's ``data``, the loop merges the second witness through the real ``Hub``, and the
build goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from collector.model import Event, EventKind, Severity
from collector.storage.repo import SnapshotFilter
from tests.snapshot.test_committer import _run, setup, step

BUS = "00000000:00:06.0"


class Gate(str):
    """A string in an event's ``data`` that holds a copy made off the loop thread until released:
    ``asdict`` deep-copies such leaves, in the middle of walking the dict that holds them (a str
    subclass, so it is stored like any string)."""

    loop_thread: int
    reached: threading.Event
    release: threading.Event

    def __new__(cls, loop_thread: int) -> Gate:
        self = super().__new__(cls, "gate")
        self.loop_thread = loop_thread
        self.reached = threading.Event()
        self.release = threading.Event()
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> str:
        if threading.get_ident() != self.loop_thread and not self.reached.is_set():
            self.reached.set()
            self.release.wait(5.0)
        return "gate"


def _xid(source: str, data: dict[str, Any]) -> Event:
    return Event(
        kind=EventKind.XID,
        ts=time.time(),
        source=source,
        message=f"Xid 43 ({source})",
        severity=Severity.CRITICAL,
        gpu=BUS,
        xid=43,
        data=data,
    )


def test_a_witness_merged_while_the_capture_is_built_does_not_hold_the_snapshot_back(
    migrated_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=0.3)
    caplog.set_level(logging.ERROR, logger="collector.snapshot.committer")
    waited: dict[str, float] = {}

    async def body() -> None:
        for i in range(50):
            hub.emit(step(i))
        gate = Gate(threading.get_ident())
        t0 = time.monotonic()
        hub.emit(_xid("kmsg", {"gate": gate, "kernel_seq": 1001}))  # the kernel's line first
        deadline = time.monotonic() + 2.0
        while not gate.reached.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        # NVML's report of the same fault: merged into the kernel's event (new keys in its data)
        hub.emit(_xid("nvml", {"uuid": "GPU-5a1c0000", "index": 1}))
        gate.release.set()
        while not committed and time.monotonic() - t0 < 10.0:
            await asyncio.sleep(0.02)
        waited["s"] = time.monotonic() - t0

    asyncio.run(_run(c, body))
    # committed at once (settle 0.3 s), not held until a stop: the demo waited 120 s
    assert committed, "the snapshot was not committed within 10 s"
    assert waited["s"] < 5.0
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert [r["id"] for r in rows] == committed
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures  # the build never failed


@pytest.mark.parametrize("stage", ["build", "spool"])
def test_a_first_version_that_fails_is_still_committed_by_its_amendment(
    migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """Whatever else fails the first version before its amendment is scheduled (a build that
    fails every time, a spool write that raises what no one expected), the fault is committed
    within the settle time by the amendment's capture, not at the stop."""
    from collector.snapshot import commit as committer_module

    hub, repo, c, committed = setup(migrated_url, tmp_path, settle=0.3)
    real_build, real_write, calls = committer_module._build, committer_module.spool.write, [0]

    def failing_build(cap: Any) -> Any:
        calls[0] += 1
        if calls[0] <= committer_module.BUILD_ATTEMPTS:  # the first capture never builds
            raise RuntimeError("a build that fails")
        return real_build(cap)

    def failing_write(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("a spool write that raises what no one expected")
        return real_write(*args)

    if stage == "build":
        monkeypatch.setattr(committer_module, "_build", failing_build)
    else:
        monkeypatch.setattr(committer_module.spool, "write", failing_write)
    waited: dict[str, float] = {}

    async def body() -> None:
        for i in range(20):
            hub.emit(step(i))
        t0 = time.monotonic()
        hub.emit(_xid("kmsg", {"kernel_seq": 1002}))
        while not committed and time.monotonic() - t0 < 10.0:
            await asyncio.sleep(0.02)
        waited["s"] = time.monotonic() - t0

    asyncio.run(_run(c, body))
    assert committed and waited["s"] < 5.0
    # the build tried again, then the amendment's capture; the spool write once more, for the amendment
    assert calls[0] == (committer_module.BUILD_ATTEMPTS + 1 if stage == "build" else 2)
    rows, _ = repo.list_snapshots(SnapshotFilter())
    assert [r["id"] for r in rows] == committed
