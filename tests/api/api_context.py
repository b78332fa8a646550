"""The API over a real database, without the sources: the service's own ``AppContext`` with a
real hub, writer, committer and detector task (not running as tasks unless a test starts them)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from collector.context import AppContext
from collector.detectors.task import DetectorTask
from collector.settings import EngineConfig, Settings
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter
from tests.wiring import with_committer

ApiContext = AppContext


def make_context(url: str, *, host_name: str = "node-a", spool_dir: Path | None = None, **settings: Any) -> AppContext:
    settings.setdefault("engines", [EngineConfig(name="decode-0", url="http://127.0.0.1:1", pair="pd-0")])
    s = Settings(database=url, host_name=host_name, **settings)
    repo = Repository(make_engine(url), host=host_name)
    writer = BatchWriter(repo, interval=0.5)
    import tempfile

    hub, committer = with_committer(s, repo, rows=writer, spool_dir=spool_dir or Path(tempfile.mkdtemp()), settle_s=0.2, window_s=30.0)
    return AppContext(
        settings=s,
        hub=hub,
        repo=repo,
        writer=writer,
        committer=committer,
        detectors=DetectorTask(hub.view, hub.emit, s.detectors),
        loop=asyncio.new_event_loop(),
        manual_wait_s=0.05,
    )
