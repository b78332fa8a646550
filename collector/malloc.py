"""Internal: The C allocator's settings for a long-running sidecar (glibc only; elsewhere nothing).

Two of glibc's defaults cost the sidecar memory it never gives back. Its threshold for
serving an allocation by its own mapping rises to the size of any such block freed (up to 32
MiB), so after the first snapshot the 4-8 MiB buffers of every later one (request blocks, the
encoded parts) come from the heap and fragment it; and each thread that allocates (the
writer's and the snapshot builder's workers) gets an arena of its own, which keeps what it
freed. At 8 engines the two made the faults' half of the node bench 75 MiB above the steady
one (BENCHMARKS.md, Node scale). A fixed 1 MiB threshold and two arenas: what is larger is
mapped and unmapped, and freed memory is reused across threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
MMAP_THRESHOLD = 1 << 20
ARENA_MAX = 2


def tune() -> bool:
    """Apply the settings; True when glibc took them. Never raises."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_ARENA_MAX, ARENA_MAX))
    except (OSError, AttributeError) as exc:
        log.debug("mallopt unavailable: %s", exc)
        return False
    return ok
