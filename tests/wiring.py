"""Ingest wired to a snapshot committer as the service wires them (collector/service.py): the
intake first, the committer given the view, then the hub given its consumers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from collector.ingest.config import IngestConfig
from collector.ingest.hub import Hub
from collector.ingest.intake import Intake, RowSink
from collector.ingest.live import LiveView
from collector.ingest.routing import EventConsumer
from collector.snapshot.committer import SnapshotCommitter


def with_committer(
    config: IngestConfig,
    repo: Any,
    *,
    rows: RowSink | None = None,
    clock: Callable[[], float] = time.time,
    proc_root: Path = Path("/proc"),
    then: Sequence[EventConsumer] = (),
    **committer: Any,
) -> tuple[Hub, SnapshotCommitter]:
    intake = Intake(config, rows=rows, clock=clock, proc_root=proc_root)
    c = SnapshotCommitter(LiveView(intake), repo, **committer)
    return Hub(intake, consumers=[c.on_event, *then]), c
