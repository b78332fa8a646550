"""Internal: the in-engine end of the channel: one ring file per writing process and engine.

Every recorder (``collector.recorder.stats``, ``collector.recorder.requests``) writes through a
``RecorderChannel``. It names the file (``collector.channel.naming``), writes the ``meta`` record
first and again each time the ring wraps (so a reader that starts late still learns who wrote the
records), and turns any fault into a disabled channel: the engine never sees an exception from
us, and the log says once why the recorder stopped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collector.channel.naming import ring_file_name
from collector.channel.ringfile import RingWriter
from collector.channel.secure import ensure_private_dir
from collector.channel.wire import encode
from collector.recorder.identity import EngineIdentity

log = logging.getLogger("collector.recorder")

STATS_RING_BYTES = 4 * 1024 * 1024  # ~35,000 steps of binary step records
SCHED_RING_BYTES = 16 * 1024 * 1024  # ~1,000 steps at 256 running requests, more at fewer
RECORD_FORMAT = 3  # binary S/R/W records (collector.channel.codec); 2 wrote the workload as JSON


class RecorderChannel:
    """Writes records to one ring; after the first fault, does nothing at all."""

    def __init__(
        self,
        *,
        identity: EngineIdentity,
        role: str,
        directory: Path,
        capacity: int,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.identity = identity
        self.engine = identity.engine
        self.engine_index = identity.engine_index
        self.role = role
        self.pid = os.getpid() if pid is None else pid
        self.run = identity.run
        self.path = Path(directory) / ring_file_name(self.engine, role, self.pid, self.run)
        self.failed: str | None = None
        self._meta = encode(
            {
                "t": "meta",
                "engine": self.engine,
                "role": role,
                "pid": self.pid,
                "vllm_version": identity.engine_version,
                "format": RECORD_FORMAT,
                "created": clock(),
                **identity.facts(),
            }
        )
        self._ring: RingWriter | None = None
        self._capacity = capacity
        self._wrap_at = capacity  # the head past which the ring wrapped again: the meta record follows
        try:
            ensure_private_dir(directory)  # 0700, refused when another user made it
            self._ring = RingWriter(self.path, capacity=capacity)
            self._ring.append(self._meta)
        except Exception as exc:  # noqa: BLE001 - the engine must start whatever happens here
            self.fail(f"cannot create {self.path}: {exc}")

    @property
    def active(self) -> bool:
        return self._ring is not None

    def write(self, payload: bytes, crc: int | None = None, tail: bytes = b"") -> None:
        """One record, ``payload`` then ``tail``; ``crc``, when given, is the CRC of both (see
        ``RingWriter.append``)."""
        ring = self._ring
        if ring is None:
            return
        try:
            if ring.append(payload, crc, tail) >= self._wrap_at:
                self._wrap_at = (ring.head // self._capacity + 1) * self._capacity
                ring.append(self._meta)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"write failed: {exc!r}")

    def fail(self, reason: str) -> None:
        """Stop recording for good and say so once; never raises."""
        if self.failed is not None:
            return
        self.failed = reason
        ring, self._ring = self._ring, None
        try:
            log.warning("flight recorder (%s, engine %s) disabled: %s", self.role, self.engine, reason)
        except Exception:  # noqa: BLE001
            pass
        if ring is not None:
            ring.close()

    def close(self) -> None:
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()


def guarded(channel: RecorderChannel | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn``; a fault disables ``channel`` instead of reaching the engine."""
    if channel is None or not channel.active:
        return None
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        channel.fail(f"{what} raised {exc!r}")
        return None
