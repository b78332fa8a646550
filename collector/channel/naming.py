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
    if len(parts) != 3 or not parts[2].isdigit() or not parts[0]:
        return None
    return RingName(unquote(parts[0]), parts[1], int(parts[2]))
