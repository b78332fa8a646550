from __future__ import annotations

import asyncio
from pathlib import Path

from collector.model import LogLine
from collector.settings import EngineConfig, Settings
from collector.sources.base import SourceError, SourceUnsupported
from collector.sources.registry import SOURCES
from collector.sources.supervisor import SupervisedSource


class Sink:
    def __init__(self) -> None:
        self.items: list[object] = []

    def emit(self, item: object) -> None:
        self.items.append(item)


class Flaky:
    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0

    async def run(self, sink: Sink) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise SourceError(f"failure {self.runs}")
        sink.emit(LogLine("e", 0.0, "ran"))
        await asyncio.sleep(3600)


class Unsupported:
    name = "nothing-here"
    runs = 0

    async def run(self, sink: Sink) -> None:
        self.runs += 1
        raise SourceUnsupported("no such device")


def test_a_failing_source_is_restarted_with_backoff_and_reported_meanwhile() -> None:
    src = Flaky(failures=2)
    sup = SupervisedSource(src, min_backoff=0.01, max_backoff=0.05)
    sink = Sink()
    seen_down: list[bool] = []

    async def scenario() -> None:
        task = asyncio.create_task(sup.run(sink))
        while not sink.items:
            seen_down.append(sup.status.up)
            await asyncio.sleep(0.002)
        task.cancel()

    asyncio.run(scenario())
    assert src.runs == 3 and sup.status.errors == 2
    assert False in seen_down  # it was reported down between failures
    assert sup.status.up  # and up again once it runs


def test_an_unsupported_source_is_reported_once_and_not_restarted() -> None:
    src = Unsupported()
    sup = SupervisedSource(src, min_backoff=0.01)
    asyncio.run(asyncio.wait_for(sup.run(Sink()), 2))
    assert src.runs == 1
    (status,) = sup.statuses()
    assert (status.supported, status.up, status.reason) == (False, False, "no such device")


def built(settings: Settings) -> dict[str, list[object]]:
    return {entry.name: entry.build(settings) for entry in SOURCES}


def test_the_source_table_follows_the_settings(tmp_path: Path) -> None:
    log = tmp_path / "decode.log"
    s = Settings(
        engines=[
            EngineConfig(name="decode-0", url="http://127.0.0.1:8000", log=str(log)),
            EngineConfig(name="prefill-0", url="http://127.0.0.1:8001"),
        ],
        nvml="off",
        kmsg=str(tmp_path / "kern.log"),
        recorder_dir=tmp_path / "rec",
    )
    got = built(s)
    assert [type(x).__name__ for x in got["vllm_metrics"]] == ["VllmMetricsSource"]
    assert [x.engine for x in got["engine_log"]] == ["decode-0"]  # type: ignore[attr-defined]
    assert [type(x).__name__ for x in got["kmsg"]] == ["KmsgSource"]
    assert got["nvml"] == [] and len(got["recorder"]) == 1

    off = built(Settings(nvml="off", kmsg="off", recorder="off"))
    assert all(v == [] for v in off.values())
