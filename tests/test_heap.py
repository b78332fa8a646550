from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from collector import heap


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_young_passes_are_rarer_and_what_the_start_made_is_kept_out_of_later_passes() -> None:
    heap.tune()
    assert gc.get_threshold() == (heap.YOUNG, heap.OLDER, heap.OLDER)
    started = [[i] for i in range(1000)]  # what a start makes and keeps
    heap.freeze_startup()
    assert gc.get_freeze_count() >= len(started)
    assert not any(o is started for o in gc.get_objects())  # no pass walks it any more
    cycle: list[object] = []
    cycle.append(cycle)  # a cycle made later is still collected
    del cycle
    assert gc.collect() >= 1
