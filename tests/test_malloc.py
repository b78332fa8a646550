from __future__ import annotations

import platform
import subprocess
import sys

from collector import malloc

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _fresh(script: str) -> list[str]:
    """What ``script`` prints, run in a fresh interpreter: the suite's own heap (what earlier
    tests freed) would serve the allocations measured."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()


def test_glibc_takes_the_allocator_settings_and_elsewhere_nothing_is_done() -> None:
    took = malloc.tune()
    assert took is GLIBC
    # a large buffer freed and made again is served (the sidecar's snapshots do this every fault)
    for _ in range(3):
        buf = bytearray(8 << 20)
        assert len(buf) == 8 << 20
        del buf


_SCENARIO = """
from collector import malloc
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
malloc.tune()
copies, live = [], []
for _ in range(2000):  # a snapshot's block copies (20 kB each) between allocations that live on
    copies.append(bytes(20_000))
    live.append(bytearray(600))
del copies
freed = resident()  # glibc keeps them: each sits between two live ones
trimmed = malloc.trim()
print(trimmed, freed - resident(), len(live))
"""


def test_a_trim_gives_back_the_pages_freed_between_live_allocations() -> None:
    if not GLIBC:
        assert malloc.trim() is False
        return
    out = _fresh(_SCENARIO)
    trimmed, returned, live = out[0] == "True", int(out[1]), int(out[2])
    assert trimmed
    assert returned > 20 << 20  # of the 40 MB freed, most go back
    assert live == 2000


# a ring read's copy (750 kB) made and freed again and again, as the recorder's source does per
# ring and poll
_READS = """
import resource
from collector import malloc
malloc.tune()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
copy = b"\\x01" * 750_000
del copy
before = faults()
for _ in range(100):
    copy = b"\\x01" * 750_000  # written whole, as a read's copy is
    del copy
print(faults() - before)
"""


def test_a_buffer_freed_and_made_again_reuses_its_pages() -> None:
    if not GLIBC:
        return
    faults = int(_fresh(_READS)[0])
    # given back after each, each copy faults its pages in anew: 15,100 for the 100
    assert faults < 1_000


def test_the_heaps_usage_counts_what_is_made_and_freed() -> None:
    if not GLIBC:
        assert malloc.usage() is None
        return
    out = _fresh(
        "from collector import malloc\n"
        "malloc.tune()\n"
        "a = malloc.usage()\n"
        "held = [bytearray(600) for _ in range(20000)]\n"  # 12 MB of small blocks: in the heap
        "b = malloc.usage()\n"
        "big = bytearray(8 << 20)\n"  # above the 1 MiB threshold: a mapping of its own
        "c = malloc.usage()\n"
        "del held\n"
        "d = malloc.usage()\n"
        "print(b['in_use'] - a['in_use'], c['mapped'] - b['mapped'], b['in_use'] - d['in_use'], d['free'] - b['free'], len(big))"
    )
    grown, mapped, shrunk, freed, _ = (int(x) for x in out)
    assert grown > 12_000_000
    assert mapped >= 8 << 20
    assert shrunk > 12_000_000
    assert freed > 0 or shrunk > 12_000_000  # freed blocks are held, or given back from the top
