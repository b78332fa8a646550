"""``flightrec`` with a SIGKILL at one point of a snapshot, for the kill-point suite
(``test_kill_points.py``). The product has no kill switch: this wrapper patches the point from
outside, then runs ``collector.cli.main`` as ``python -m collector.cli`` would.

    FLIGHTREC_KILL_AT=in_commit_tx FLIGHTREC_KILL_TRIGGER=xid python tests/faults/kill_at.py serve --config C

``FLIGHTREC_KILL_TRIGGER`` names the trigger kind whose snapshot is killed (``xid``, ``manual``);
other snapshots pass the point untouched. The points, in the order a snapshot passes them:

- ``intent_tmp``: the trigger is read (the kernel's line) and its intent written to its
  temporary name, not renamed yet: nothing of the fault is durable
- ``before_spool``: the capture is built, nothing is spooled yet (only the trigger's intent)
- ``spool_tmp``: the spool's temporary file is written and fsynced, not renamed yet
- ``after_spool``: spooled, the database not tried yet
- ``in_commit_tx``: inside the snapshot's database transaction, before its COMMIT
- ``after_commit``: committed, its spool file and intent not removed yet
- ``in_amend``: inside the amendment's transaction (the first version committed)

``FLIGHTREC_SPOOL_FAILS=N`` (no kill) makes the first N spool writes fail as a full disk does
(``OSError(ENOSPC)``), for the graceful-stop tests (``test_stop.py``).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

from collector import durable  # noqa: E402
from collector.snapshot import intent, spool  # noqa: E402
from collector.storage.repo import Repository, SnapshotCommit  # noqa: E402

POINTS = ("intent_tmp", "before_spool", "spool_tmp", "after_spool", "in_commit_tx", "after_commit", "in_amend")
POINT = os.environ.get("FLIGHTREC_KILL_AT", "")
TRIGGER = os.environ.get("FLIGHTREC_KILL_TRIGGER", "xid")
_local = threading.local()


def die(where: str) -> None:
    print(f"kill_at: SIGKILL at {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _kind(trigger: Any) -> str:
    return str(trigger.get("kind")) if isinstance(trigger, dict) else ""


def install(point: str) -> None:
    if point not in POINTS:
        raise SystemExit(f"kill_at: FLIGHTREC_KILL_AT must be one of {', '.join(POINTS)}, not {point!r}")
    original_write = spool.write

    def write(directory: Path, name: str, header: dict[str, Any], meta: dict[str, Any], blobs: dict[str, bytes]) -> Path:
        mine = _kind(header.get("trigger")) == TRIGGER and not meta.get("amend")
        if mine and point == "before_spool":
            die(point)
        _local.kill_on_replace = mine and point == "spool_tmp"
        try:
            path = original_write(directory, name, header, meta, blobs)
        finally:
            _local.kill_on_replace = False
        if mine and point == "after_spool":
            die(point)
        return path

    spool.write = write
    original_intent_write = intent.write

    def write_intent(directory: Path, engine: str, ev: Any, accepted_at: float) -> Path:
        _local.kill_on_replace = point == "intent_tmp" and ev.kind.value == TRIGGER
        try:
            return original_intent_write(directory, engine, ev, accepted_at)
        finally:
            _local.kill_on_replace = False

    intent.write = write_intent

    def replace(src: Any, dst: Any) -> None:
        if getattr(_local, "kill_on_replace", False):
            assert Path(src).exists()  # the temporary file is whole on disk
            die(point)
        os.replace(src, dst)

    patched_os = SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    patched_os.replace = replace
    setattr(durable, "os", patched_os)  # noqa: B010 - the durable writer's own os, not everyone's

    original_commit = Repository.commit_snapshots

    def commit_snapshots(self: Repository, items: Any, **kw: Any) -> list[tuple[int, bool]]:
        mine = [i for i in items if _kind(i.doc.trigger) == TRIGGER]
        firsts = [i for i in mine if isinstance(i, SnapshotCommit)]
        _local.kill_on_commit = bool(firsts) and point == "in_commit_tx" or (bool(mine) and not firsts and point == "in_amend")
        try:
            out = original_commit(self, items, **kw)
        finally:
            _local.kill_on_commit = False
        if firsts and point == "after_commit":
            die(point)
        return out

    Repository.commit_snapshots = commit_snapshots  # type: ignore[method-assign]

    def on_commit(conn: Any) -> None:  # before the COMMIT is sent: the transaction is open
        if getattr(_local, "kill_on_commit", False):
            die(point)

    event.listen(Engine, "commit", on_commit)


def fail_spool_writes(n: int) -> None:
    original_write = spool.write
    left = [n]

    def write(directory: Path, name: str, header: dict[str, Any], meta: dict[str, Any], blobs: dict[str, bytes]) -> Path:
        if left[0] > 0:
            left[0] -= 1
            print(f"kill_at: spool write {name} fails (disk full)", file=sys.stderr, flush=True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original_write(directory, name, header, meta, blobs)

    spool.write = write


if __name__ == "__main__":
    if POINT:
        install(POINT)
    if os.environ.get("FLIGHTREC_SPOOL_FAILS"):
        fail_spool_writes(int(os.environ["FLIGHTREC_SPOOL_FAILS"]))
    from collector.cli import main

    sys.exit(main())
