from __future__ import annotations

import platform

from collector import malloc


def test_glibc_takes_the_allocator_settings_and_elsewhere_nothing_is_done() -> None:
    took = malloc.tune()
    assert took is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    # a large buffer freed and made again is served (the sidecar's snapshots do this every fault)
    for _ in range(3):
        buf = bytearray(8 << 20)
        assert len(buf) == 8 << 20
        del buf
