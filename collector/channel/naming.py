"""Ring file names: ``{engine}.{role}.{pid}.{run}.ring`` in the recorder folder.

``run`` is the writing engine's run id (``collector.recorder.identity``: its API server's start
time in milliseconds), so a restarted engine writes new files even where its pids repeat (a
container's pids in its own namespace, a simulator's): the sidecar follows the new run from its
first step and keeps the old files as the previous run. Recorders before the run id wrote
``{engine}.{role}.{pid}.ring``; those names are still read (``run`` None), and the sidecar
notices such a file replaced under the same name instead (``collector.sources.recorder``).

The engine name is percent-encoded (``/`` and ``.`` included), so a DP engine named
``decode-0/dp1`` becomes ``decode-0%2Fdp1.stats.4242.ring`` and the name splits back
unambiguously. The writer's meta record carries the real name too; the file name is what a
reader falls back on once the ring has wrapped past that record.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import quote, unquote

__all__ = ["ROLES", "SUFFIX", "RingName", "parse_ring_file_name", "ring_file_name"]

SUFFIX = ".ring"
ROLES = ("stats", "sched")


class RingName(NamedTuple):
    engine: str
    role: str
    pid: int
    run: int | None = None  # None: a name written before the run id


def ring_file_name(engine: str, role: str, pid: int, run: int | None = None) -> str:
    tail = f".{run}" if run is not None else ""
    return f"{quote(engine, safe='').replace('.', '%2E')}.{role}.{pid}{tail}{SUFFIX}"


def _number(text: str) -> int | None:
    # ASCII digits only ("²".isdigit() is true, int() of it raises), and at most 19 of them: int()
    # of a 5,000-digit run raises ValueError, which stopped the reader's poll of the folder.
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def parse_ring_file_name(name: str) -> RingName | None:
    """The parts of a ring file name, or None for a name that is not one of ours."""
    if not name.endswith(SUFFIX):
        return None
    parts = name[: -len(SUFFIX)].split(".")
    if len(parts) not in (3, 4) or not parts[0]:
        return None
    pid = _number(parts[2]) if len(parts[2]) <= 10 else None
    run = _number(parts[3]) if len(parts) == 4 else None
    if pid is None or (len(parts) == 4 and run is None):
        return None
    return RingName(unquote(parts[0]), parts[1], pid, run)
