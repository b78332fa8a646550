"""A full disk under the SQLite database and the spool: one clear error (logged once, in
/healthz), nothing lost that memory holds, writing resumes when space returns, and a graceful
stop afterwards keeps everything.

The real case: a 2 MB tmpfs (needs root and mount; skipped with the reason otherwise), filled
by a file until ENOSPC. The same scenario with ENOSPC injected runs everywhere, so the claim is
never only skipped."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.model import Event, EventKind, Severity, StepRecord
from collector.service import Service
from collector.settings import Settings
from collector.storage.connect import StorageError, make_engine
from collector.storage.repo import Repository, SnapshotFilter

ENGINE = "decode-0"


def run_disk_full(folder: Path, fill: Callable[[], None], free: Callable[[], None], caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The sidecar on ``folder`` (database and spool); the disk fills while steps and a fault
    come in, then space returns, then a graceful stop. Returns what was seen."""
    db = f"sqlite:///{folder / 'f.db'}"
    settings = Settings(engines=[], database=db, nvml="off", kmsg="off", port=0, recorder_dir=folder.parent / "rec", write_batch_interval=0.1)
    svc = Service(settings, spool_dir=folder / "spool")
    seen: dict[str, Any] = {}
    caplog.set_level(logging.INFO)

    async def scenario() -> None:
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.started.wait(), 30)
        ctx = svc.ctx
        assert ctx is not None
        step = 0

        def emit(n: int) -> None:
            nonlocal step
            for _ in range(n):
                ctx.hub.emit(StepRecord(engine=ENGINE, ts=time.time(), step=step, running=3, waiting=1, kv_cache_usage=0.5))
                step += 1

        emit(100)
        while ctx.writer.steps_written < 100:
            await asyncio.sleep(0.05)
        fill()
        # SQLite reuses its WAL's space: write until the database needs more than the disk has
        for _ in range(200):
            emit(1000)
            await asyncio.sleep(0.1)
            if ctx.writer.db_up is False:
                break
        seen["full_health"] = ctx.health()
        seen["steps_at_fault"] = step
        ctx.hub.emit(
            Event(kind=EventKind.ENGINE_DEAD, ts=time.time(), source="log", engine=ENGINE, message="EngineDeadError", severity=Severity.CRITICAL)
        )
        for _ in range(100):
            await asyncio.sleep(0.1)
            if ctx.committer.spool_error and ctx.committer.backlog:
                break
        await asyncio.sleep(settings.snapshot_settle_s + 0.5)  # its amendment (the late evidence) is captured too
        emit(500)  # the steps go on while the disk is full
        await asyncio.sleep(1.5)  # several writer rounds and commit retries fail meanwhile
        seen["spool_health"] = ctx.health()
        seen["steps_sent"] = step
        free()
        for _ in range(300):
            if ctx.writer.db_up and ctx.committer.committed == 1 and ctx.writer.steps_written >= step:
                break
            await asyncio.sleep(0.1)
        seen["back_health"] = ctx.health()
        svc.request_stop()
        await task

    asyncio.run(scenario())
    msgs = [r.getMessage() for r in caplog.records]
    seen["write_failed_logs"] = sum(m.startswith("database write failed") for m in msgs)
    seen["spool_failed_logs"] = sum(m.startswith("cannot spool the snapshot") for m in msgs)
    repo = Repository(make_engine(db), host=svc.ctx.hub.host)  # type: ignore[union-attr]
    seen["stored_steps"] = sorted(r["step"] for r in repo.recent_steps(ENGINE, since=0))
    seen["snapshots"], _ = repo.list_snapshots(SnapshotFilter(engine=ENGINE))
    return seen


def check(seen: dict[str, Any]) -> None:
    full = seen["full_health"]
    assert full["status"] == "degraded" and full["database_up"] is False
    assert "database or disk is full" in full["database_error"]
    spool = seen["spool_health"]
    assert spool["spool_error"] and "No space left on device" in spool["spool_error"] and spool["snapshots_waiting"] == 1
    assert seen["write_failed_logs"] == 1 and seen["spool_failed_logs"] == 1  # once per failing spell
    back = seen["back_health"]
    assert back["database_up"] is True and back["snapshots_waiting"] == 0 and back["ingest"]["rows_pending"] == 0
    assert seen["stored_steps"] == list(range(seen["steps_sent"]))  # nothing lost, nothing twice
    [snap] = seen["snapshots"]
    assert snap["last_step"] == seen["steps_at_fault"] - 1  # captured at the fault, not when space returned


# -- a real full disk -----------------------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs root to mount a 2 MB tmpfs (the injected ENOSPC test covers the rest)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the injected ENOSPC test covers the rest")
    try:
        yield mnt / "data"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_under_sqlite_and_the_spool_loses_nothing(small_fs: Path, caplog: pytest.LogCaptureFixture) -> None:
    filler = small_fs.parent / "filler"

    def fill() -> None:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for chunk in (1 << 16, 4096, 512):
                try:
                    while True:
                        os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)

    seen = run_disk_full(small_fs, fill, filler.unlink, caplog)
    check(seen)


# -- the same, ENOSPC injected ----------------------------------------------------------------------
def test_an_injected_enospc_under_sqlite_and_the_spool_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from collector.snapshot import spool

    full = False
    real_write, real_batch, real_store = spool.write, Repository.write_batch, Repository.commit_snapshots

    def spool_write(*a: Any, **k: Any) -> Path:
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(*a, **k)

    def disk_full(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            if full:
                raise StorageError("OperationalError: (sqlite3.OperationalError) database or disk is full")
            return real(*a, **k)

        return call

    monkeypatch.setattr(spool, "write", spool_write)
    monkeypatch.setattr(Repository, "write_batch", disk_full(real_batch))
    monkeypatch.setattr(Repository, "commit_snapshots", disk_full(real_store))

    def fill() -> None:
        nonlocal full
        full = True

    def free() -> None:
        nonlocal full
        full = False

    check(run_disk_full(tmp_path / "data", fill, free, caplog))
