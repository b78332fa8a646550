from __future__ import annotations

from collector.ingest.windows import LineWindow, TimeWindow
from collector.model import GpuSample, LogLine


def test_time_ring_keeps_the_last_seconds() -> None:
    ring = TimeWindow(10.0)
    for t in range(100):
        ring.add(GpuSample(gpu="g", index=0, ts=float(t)))
    assert len(ring) == 11 and ring.since(95.0)[0].ts == 95.0


def test_line_ring_is_bounded() -> None:
    ring = LineWindow(3)
    ring.extend(LogLine("d", float(i), f"l{i}") for i in range(10))
    assert [x.line for x in ring.all()] == ["l7", "l8", "l9"]
