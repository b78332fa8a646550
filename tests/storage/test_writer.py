from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector.ingest.hub import Hub
from collector.model import Event, EventKind, StepRecord
from collector.settings import EngineConfig, Settings
from collector.storage.db import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter


def test_rows_held_while_the_database_is_down_are_written_when_it_is_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    hub = Hub(Settings(engines=[EngineConfig(name="decode-0", url="http://d")]))
    repo = Repository(make_engine(url), host=hub.host)
    writer = BatchWriter(hub, repo, interval=0.05)
    now = time.time()

    async def scenario() -> None:
        for i in range(300):
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.001, step=i, running=1))
        hub.emit(Event(kind=EventKind.LOG, ts=now, source="log", message="kept", engine="decode-0"))
        await writer.flush()  # no tables yet: the write fails
        assert writer.db_up is False and len(hub.pending.steps) == 300
        await asyncio.to_thread(upgrade, url)
        for i in range(300, 310):
            hub.emit(StepRecord(engine="decode-0", ts=now + i * 0.001, step=i, running=1))
        await writer.flush()
        assert writer.db_up is True

    asyncio.run(scenario())
    assert [s["step"] for s in repo.recent_steps("decode-0", since=0)] == list(range(310))
    assert [e["message"] for e in repo.list_events()] == ["kept"]
