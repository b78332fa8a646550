"""Ring file names: ``{engine}.{role}.{pid}.ring`` in the recorder folder.

The engine name is percent-encoded (``/`` and ``.`` included), so a DP engine named
``decode-0/dp1`` becomes ``decode-0%2Fdp1.stats.4242.ring`` and the name splits back
unambiguously. The writer's meta record carries the real name too; the file name is what a
reader falls back on once the ring has wrapped past that record.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import quote, unquote

SUFFIX = ".ring"
ROLES = ("stats", "sched")


class RingName(NamedTuple):
    engine: str
    role: str
    pid: int


def ring_file_name(engine: str, role: str, pid: int) -> str:
    return f"{quote(engine, safe='').replace('.', '%2E')}.{role}.{pid}{SUFFIX}"


def parse_ring_file_name(name: str) -> RingName | None:
    """The parts of a ring file name, or None for a name that is not one of ours."""
    if not name.endswith(SUFFIX):
        return None
    parts = name[: -len(SUFFIX)].split(".")
    pid = parts[2] if len(parts) == 3 else ""
    # ASCII digits only ("²".isdigit() is true, int() of it raises), and at most 10 of them: int()
    # of a 5,000-digit run raises ValueError, which stopped the reader's poll of the folder.
    if not (pid.isascii() and pid.isdigit() and len(pid) <= 10) or not parts[0]:
        return None
    return RingName(unquote(parts[0]), parts[1], int(pid))
