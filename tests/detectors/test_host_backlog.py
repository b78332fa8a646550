from __future__ import annotations

from collections.abc import Callable

from collector.detectors.config import HostBacklogThresholds
from collector.detectors.host_backlog import detect_host_backlog
from collector.model import Severity

THR = HostBacklogThresholds(window_s=60, growth_ratio=1.5, load_tolerance=0.2, pending_min=64, cache_full=0.95)
L = {"engine": "decode-0"}


def s(f: Callable[[int], float], n: int = 60) -> list[tuple[float, float]]:
    return [(float(t), float(f(t))) for t in range(n)]


def test_host_blocks_per_request_growing_with_a_steady_load_warns() -> None:
    st = detect_host_backlog(s(lambda t: 8 * (500 + 20 * t)), s(lambda t: 8 + t % 2), [], [], now=59, labels=L, thr=THR)
    assert st.state is Severity.WARNING and "per running request" in st.reason and st.value and st.value > 1.5


def test_host_blocks_growing_with_the_load_is_fine() -> None:
    # twice the requests hold twice the blocks: that is load, not a leak
    assert detect_host_backlog(s(lambda t: 500 * (4 + t // 8)), s(lambda t: 4 + t // 8), [], [], now=59, labels=L, thr=THR).state is Severity.OK


def test_many_mirror_rows_alone_are_not_a_backlog() -> None:
    # the old signal: rows per step following the batch; no host-side series grows
    assert detect_host_backlog(s(lambda t: 4000), s(lambda t: 16), s(lambda t: 10), s(lambda t: 0.4), now=59, labels=L, thr=THR).state is Severity.OK


def test_pending_page_transfers_piling_up_warn() -> None:
    st = detect_host_backlog([], s(lambda t: 16), s(lambda t: 20 + 5 * t), [], now=59, labels=L, thr=THR)
    assert st.state is Severity.WARNING and "pending page transfers" in st.reason


def test_a_small_pending_level_is_not_a_backlog() -> None:
    assert detect_host_backlog([], s(lambda t: 16), s(lambda t: 1 + t // 10), [], now=59, labels=L, thr=THR).state is Severity.OK


def test_a_full_host_cache_warns_in_either_unit() -> None:
    assert detect_host_backlog([], [], [], s(lambda t: 0.97), now=59, labels=L, thr=THR).state is Severity.WARNING
    assert detect_host_backlog([], [], [], s(lambda t: 97.0), now=59, labels=L, thr=THR).state is Severity.WARNING
    assert detect_host_backlog([], [], [], s(lambda t: 40.0), now=59, labels=L, thr=THR).state is Severity.OK
