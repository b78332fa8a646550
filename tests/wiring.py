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
from collector.snapshot.hang import HangStacks


def with_committer(
    config: IngestConfig,
    repo: Any,
    *,
    rows: RowSink | None = None,
    clock: Callable[[], float] = time.time,
    proc_root: Path = Path("/proc"),
    then: Sequence[EventConsumer] = (),
    stack_reader: Any = None,
    **committer: Any,
) -> tuple[Hub, SnapshotCommitter]:
    """``stack_reader``: a ``StackReader`` for wedges' snapshots (``collector.snapshot.hang``)."""
    intake = Intake(config, rows=rows, clock=clock, proc_root=proc_root)
    view = LiveView(intake)
    if stack_reader is not None:
        committer["stacks"] = HangStacks(view, stack_reader, interval_s=stack_reader.settings.interval_s)
    c = SnapshotCommitter(view, repo, **committer)
    return Hub(intake, consumers=[c.on_event, *then]), c
