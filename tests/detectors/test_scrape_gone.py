from __future__ import annotations

import pytest

from collector.detectors.config import ScrapeGoneThresholds
from collector.detectors.scrape_gone import detect_scrape_gone
from collector.model import Severity


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [(None, 100.0, Severity.OK), (99.0, 100.0, Severity.OK), (90.0, 100.0, Severity.CRITICAL)],
)
def test_scrape_gone(last, now, expected) -> None:
    state = detect_scrape_gone(last, now=now, labels={"engine": "e"}, thr=ScrapeGoneThresholds(after_s=5))
    assert state.state is expected
