"""Runs one source, restarting it with backoff when it fails, so one failing source never
stops the others; keeps its health as data for /healthz and ``flightrec_source_up``."""

from __future__ import annotations

import asyncio
import logging
import time

from collector.model import SourceStatus
from collector.sources.base import Sink, Source, SourceUnsupported
from collector.sources.registry import LOST_WHEN_UNSUPPORTED
from collector.tasks import Backoff

log = logging.getLogger(__name__)


class SupervisedSource:
    def __init__(self, source: Source, *, min_backoff: float = 0.5, max_backoff: float = 30.0) -> None:
        self.source = source
        self.name: str = getattr(source, "name", type(source).__name__)
        self.backoff = Backoff(min_backoff, max_backoff)
        self.status = SourceStatus(name=self.name, up=True)

    def statuses(self) -> list[SourceStatus]:
        """The source's own detailed statuses when it has them, else ours."""
        if not self.status.supported or not self.status.up:
            return [self.status]
        own = getattr(self.source, "status", None)
        if callable(own):
            try:
                got = own()
                items = got if isinstance(got, list) else [got]
                return [s for s in items if isinstance(s, SourceStatus)] or [self.status]
            except Exception:  # a status method must not break /healthz
                return [self.status]
        return [self.status]

    async def run(self, sink: Sink) -> None:
        while True:
            started = time.monotonic()
            try:
                self.status.up = True
                await self.source.run(sink)
                return
            except asyncio.CancelledError:
                raise
            except SourceUnsupported as exc:
                self.status.supported, self.status.up, self.status.reason = False, False, str(exc)
                # A warning: what it would have captured is now missing from every snapshot.
                lost = LOST_WHEN_UNSUPPORTED.get(self.name.split(":", 1)[0], "its records")
                log.warning("%s unsupported: %s off (%s)", self.name, lost, exc)
                return
            except Exception as exc:
                self.status.up, self.status.reason = False, f"{type(exc).__name__}: {exc}"
                self.status.errors += 1
                wait = self.backoff.after_failure(time.monotonic() - started)
                log.warning("source %s failed (%s); restarting in %.1fs", self.name, self.status.reason, wait)
                await asyncio.sleep(wait)
