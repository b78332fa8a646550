"""Internal: The C allocator's settings for a long-running sidecar (glibc only; elsewhere nothing).

Two of glibc's defaults cost the sidecar memory it never gives back. Its threshold for
serving an allocation by its own mapping rises to the size of any such block freed (up to 32
MiB), so after the first snapshot the 4-8 MiB buffers of every later one (request blocks, the
encoded parts) come from the heap and fragment it; and each thread that allocates (the
writer's and the snapshot builder's workers) gets an arena of its own, which keeps what it
freed. At 8 engines the two made the faults' half of the node bench 75 MiB above the steady
one (BENCHMARKS.md, Node scale). A fixed 1 MiB threshold and two arenas: what is larger is
mapped and unmapped, and freed memory is reused across threads.

A fixed threshold also fixes glibc's threshold for giving the heap's free top back to the
system, at 128 kB: below one ring read's copy (up to 1 MiB, freed once decoded), so each read
faulted its pages in anew. Up to 4 MiB of free top is kept (docs/benchmarks-history.md, "The
heap's top"); ``trim`` after a snapshot still gives all of it back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 1 << 20
TRIM_THRESHOLD = 4 << 20
ARENA_MAX = 2


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, loaded once; None elsewhere or where it cannot be loaded."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError as exc:
        log.debug("libc unavailable: %s", exc)
        return None


def trim() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``); True when glibc
    did. After a snapshot the copies of its request blocks (tens of kB each, megabytes in all)
    are free but sit between live allocations, where glibc keeps them: each later snapshot's
    peak found a little more of them, and the resident size climbed for the first faults of a
    run. A trim takes a millisecond or two. Never raises."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError) as exc:
        log.debug("malloc_trim unavailable: %s", exc)
        return False


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): every field a ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def usage() -> dict[str, int] | None:
    """The C heap's bytes by state, from glibc's ``mallinfo2`` (all arenas): ``in_use`` (live
    allocations in the heaps), ``free`` (held by the heaps, not given back; after a ``trim``
    its whole pages are no longer resident), ``mapped`` (blocks of their own mapping). None
    where glibc or ``mallinfo2`` is missing (unknown, not zero). Never raises."""
    libc = _glibc()
    if libc is None:
        return None
    try:
        fn = libc.mallinfo2
        fn.argtypes = []
        fn.restype = _Mallinfo2
        info = fn()
    except (OSError, AttributeError) as exc:
        log.debug("mallinfo2 unavailable: %s", exc)
        return None
    return {"in_use": int(info.uordblks), "free": int(info.fordblks), "mapped": int(info.hblkhd)}


def tune() -> bool:
    """Apply the settings; True when glibc took them. Never raises."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        mallopt = libc.mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        # each applied whether or not another was refused
        took = [
            mallopt(option, value)
            for option, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_ARENA_MAX, ARENA_MAX))
        ]
        ok = all(took)
    except (OSError, AttributeError) as exc:
        log.debug("mallopt unavailable: %s", exc)
        return False
    return ok
