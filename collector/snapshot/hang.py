"""What a wedge's snapshot holds beyond a crash's: the stacks of every process of the engine,
read twice a few seconds apart, with its GPUs and environment (``collector.stacks``).

When is it read, and why then: the snapshot is committed first, as every snapshot is (the
rings, the requests, the GPU samples, the page's link: durable within a second of the trigger),
and the stacks are read at the same moment, beside it, off the event loop. They take the
interval between the two dumps (3 s by default) plus py-spy's time, and at worst py-spy's bound
twice; waiting for them before the commit would put the snapshot's durability behind a tool
that may hang. The snapshot's amendment (its late evidence, ``settle_s`` after the trigger)
waits for them instead, within ``StackReader.bound_s``, and carries them: a wedge detected 20 s
after the last step has its snapshot committed at about 20 s and its stacks stored at about 24 s,
inside the 30 s goal. Until then the first commit's ``stacks`` part says ``reading``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from collector.ingest.view import IngestView
from collector.model import Event, GpuSample
from collector.stacks import part
from collector.stacks.capture import StackReader
from collector.stacks.settings import StacksSettings

log = logging.getLogger(__name__)


class Reader(Protocol):
    """``collector.stacks.capture.StackReader``, as the snapshot stage uses it."""

    @property
    def bound_s(self) -> float: ...

    def close(self) -> None: ...

    async def capture(self, engine: str, fingerprint: dict[str, Any], read_gpus: Any = None) -> dict[str, Any]: ...


class HangStacks:
    """Starts the stacks' capture of an engine whose trigger is a wedge, and says what a snapshot
    holds of it at each commit."""

    def __init__(self, view: IngestView, reader: Reader, *, interval_s: float) -> None:
        self.view = view
        self.reader = reader
        self.interval_s = interval_s
        self.started = 0

    @classmethod
    def from_settings(cls, view: IngestView, settings: StacksSettings, *, recorder_dir: Path | None) -> HangStacks | None:
        """The service's: None when ``stacks.enabled`` is off."""
        if not settings.enabled:
            return None
        reader = StackReader(settings, recorder_dir=recorder_dir)
        warning = reader.readiness()
        if warning:  # said once at start, not first at the night's wedge
            log.warning("%s", warning)
        return cls(view, reader, interval_s=settings.interval_s)

    @property
    def bound_s(self) -> float:
        return self.reader.bound_s

    def close(self) -> None:
        self.reader.close()

    def start(self, engine: str, trigger: Event) -> asyncio.Future[dict[str, Any]] | None:
        """The capture, as a task on the running loop (None without one: a tool's freeze)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        self.started += 1
        return loop.create_task(self._capture(engine, trigger), name=f"stacks:{engine}")

    async def _capture(self, engine: str, trigger: Event) -> dict[str, Any]:
        info = self.view.engine(engine)
        fingerprint = dict(info.fingerprint) if info is not None else {}
        gpus = set(info.gpus) if info is not None and info.gpus else None

        def read_gpus() -> Sequence[GpuSample]:
            now = self.view.gpus()
            return [s for s in now.values() if gpus is None or s.index in gpus]

        started = time.time()
        try:
            doc = await asyncio.wait_for(self.reader.capture(engine, fingerprint, read_gpus), self.bound_s)
        except TimeoutError:
            return part.unavailable(f"stacks not read: the capture took longer than {self.bound_s:g} s", started_at=started, finished_at=time.time())
        except Exception as exc:  # a bug in the capture must cost the stacks only, never the snapshot
            log.exception("reading the stacks of %s failed", engine)
            return part.unavailable(f"stacks not read: {type(exc).__name__}: {exc}"[:300], started_at=started, finished_at=time.time())
        if gpus is None and doc.get("gpus"):
            doc.setdefault("notes", []).append("the engine's GPUs are not known (not configured, not in NVML's process lists): every GPU of the node")
        return doc

    def first(self, started_at: float) -> dict[str, Any]:
        """The part a first commit holds: being read."""
        return part.reading(started_at, self.interval_s)

    @staticmethod
    def result(fut: asyncio.Future[dict[str, Any]] | None, *, stopping: bool = False) -> dict[str, Any]:
        """The part an amendment holds: the capture's, or why there is none."""
        if fut is None:
            return part.unavailable("stacks not read: no event loop ran the capture")
        if not fut.done():
            fut.cancel()
            why = "the sidecar stopped" if stopping else "the amendment could not wait longer"
            return part.unavailable(f"stacks not read: {why} before the two dumps were done")
        if fut.cancelled():
            return part.unavailable("stacks not read: the capture was cancelled")
        exc = fut.exception()
        if exc is not None:
            return part.unavailable(f"stacks not read: {type(exc).__name__}: {exc}"[:300])
        return fut.result()

    @staticmethod
    def retaken() -> dict[str, Any]:
        """A wedge's snapshot retaken at start from its trigger's intent: the moment has passed."""
        return part.unavailable("stacks not read: the snapshot was retaken at start from its trigger's intent, after the moment of the hang")


async def settle(futs: Sequence[asyncio.Future[dict[str, Any]]], timeout: float) -> None:
    """Wait for the captures to end, at most ``timeout``."""
    pending = [f for f in futs if not f.done()]
    if pending:
        with contextlib.suppress(Exception):
            await asyncio.wait(pending, timeout=timeout)
