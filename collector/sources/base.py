"""The one small protocol every source implements, and the sink they emit into.

A source is an object with a ``name`` and ``async run(sink)`` that runs until cancelled,
emitting observations (``collector.model``) into the sink. ``sink.emit`` is synchronous and
never blocks: it only appends to in-memory rings and queues. A source that raises is
restarted by ``SupervisedSource`` with backoff and reported down; it never stops the others.
A source that cannot work on this machine (no NVML library, no /dev/kmsg) raises
``SourceUnsupported`` once and is reported unsupported, not restarted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from collector.errors import FlightrecError
from collector.model import Observation


class SourceError(FlightrecError):
    """A source failed this round (scrape error, parse error...). It will be retried."""


class SourceUnsupported(SourceError):
    """The source cannot run here at all (missing library or device). Not retried."""


@runtime_checkable
class Sink(Protocol):
    def emit(self, item: Observation) -> None:
        """Hand one observation to the hub. Must not block."""


@runtime_checkable
class BatchSink(Sink, Protocol):
    def emit_many(self, items: Sequence[Observation]) -> None:
        """Hand a poll's data (no events) to the hub in one call, in order. Must not block."""


@runtime_checkable
class Source(Protocol):
    name: str

    async def run(self, sink: Sink) -> None:
        """Run until cancelled, emitting observations. Raise SourceError to be restarted."""
