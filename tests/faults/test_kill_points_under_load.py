"""The kill points under node load (``under_load.py``), scaled down for CI: 4 engines x 64
running x 100 steps/s written and scraped, three faults, three points (the trigger read but not
durable, the snapshot spooled, the snapshot committed). The full size (8 x 256 x 100, every
point) is ``scripts/kill_points_under_load.py``, its result in RELIABILITY.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.under_load import NodeLoad, run_case

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def load(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeLoad]:
    node_load = NodeLoad(engines=4, running=64, steps_per_second=100, work=tmp_path_factory.mktemp("load"))
    node_load.start()
    yield node_load
    node_load.stop()


@pytest.mark.parametrize("point", ["intent_tmp", "after_spool", "after_commit"])
def test_a_kill_under_node_load_loses_no_fault_and_stores_none_twice(load: NodeLoad, tmp_path: Path, point: str) -> None:
    print(run_case(load, tmp_path, point, faults=3))
