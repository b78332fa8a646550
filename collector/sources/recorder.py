"""Reads the in-engine recorder's ring files (``collector.channel``) and emits their records.

Every ``*.ring`` file in the recorder folder is one writing process: the stat-logger plugin in
vLLM's API server (``role: stats``) or the RecordingScheduler in the engine core (``role:
sched``). A file whose writer process is gone and that has stopped growing means the engine
died: that is reported once as a ``recorder_silent`` event, which is a snapshot trigger, after
the last records were read (so the snapshot holds the steps up to the death).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collector.channel import RingCorrupt, RingReader
from collector.channel.codec import CodecError, decode
from collector.channel.naming import parse_ring_file_name
from collector.model import Event, EventKind, Severity, SourceStatus
from collector.sources.base import Sink

log = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Tail:
    reader: RingReader
    engine: str | None = None
    role: str = "unknown"
    pid: int = 0
    last_data: float = field(default_factory=time.time)
    last_head: int = -1
    silent_reported: bool = False
    bad_records: int = 0
    newest_ts: float = 0.0


class RecorderSource:
    name = "recorder"

    def __init__(
        self,
        directory: Path,
        *,
        poll_interval: float = 0.05,
        silent_after: float = 1.0,
        name_map: Callable[[str], str] | None = None,
        alive: Callable[[int], bool] = pid_alive,
        clock: Callable[[], float] = time.time,
        keep_dead_for: float = 3600.0,
        recent_window: float = 300.0,
    ) -> None:
        self.directory = Path(directory)
        self.poll_interval = poll_interval
        self.silent_after = silent_after
        self.name_map = name_map or (lambda n: n)
        self.alive = alive
        self.clock = clock
        self.keep_dead_for = keep_dead_for
        self.recent_window = recent_window
        self._tails: dict[Path, _Tail] = {}
        self._status = SourceStatus(name=self.name, up=True)

    def status(self) -> list[SourceStatus]:
        return [self._status]

    async def run(self, sink: Sink) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            self.poll(sink)
            await asyncio.sleep(self.poll_interval)

    def poll(self, sink: Sink) -> int:
        """One pass over the folder; returns the number of records emitted."""
        emitted = 0
        try:
            paths = sorted(self.directory.glob("*.ring"))
        except OSError as exc:
            self._status.up, self._status.reason = False, f"cannot list {self.directory}: {exc}"
            return 0
        for path in paths:
            tail = self._tails.get(path)
            if tail is None:
                try:
                    tail = _Tail(RingReader(path), last_data=self.clock())
                except RingCorrupt as exc:
                    log.debug("skipping %s: %s", path, exc)
                    continue
                # The file name names the writer until its meta record is read (a ring that
                # wrapped may hold records written before the last copy of that record).
                parsed = parse_ring_file_name(path.name)
                if parsed is not None:
                    tail.engine = self.name_map(parsed.engine)
                    tail.role = parsed.role
                self._tails[path] = tail
            emitted += self._drain(path, tail, sink)
        for path in [p for p in self._tails if p not in paths]:
            self._tails.pop(path).reader.close()
        self._status.up, self._status.reason, self._status.last_ok = True, "", self.clock()
        return emitted

    def _drain(self, path: Path, tail: _Tail, sink: Sink) -> int:
        now = self.clock()
        try:
            info = tail.reader.info()
            payloads = tail.reader.read()
        except (RingCorrupt, ValueError, OSError) as exc:
            log.warning("ring %s unreadable: %s", path, exc)
            return 0
        tail.pid = info.pid
        emitted = 0
        for payload in payloads:
            try:
                meta, obs = decode(payload)
            except CodecError as exc:
                tail.bad_records += 1
                self._status.errors += 1
                log.debug("bad record in %s: %s", path, exc)
                continue
            if meta is not None:
                tail.engine = self.name_map(str(meta.get("engine") or path.stem.split(".")[0]))
                tail.role = str(meta.get("role", "unknown"))
                continue
            assert obs is not None
            engine = tail.engine or self.name_map(str(getattr(obs, "engine", None) or path.stem.split(".")[0]))
            obs.engine = engine
            tail.newest_ts = max(tail.newest_ts, float(getattr(obs, "ts", 0.0)))
            sink.emit(obs)
            emitted += 1
        if payloads or info.head != tail.last_head:
            tail.last_data, tail.last_head = now, info.head
        elif (
            not tail.silent_reported
            and now - tail.last_data >= self.silent_after
            and not self.alive(info.pid)
            and tail.engine is not None
        ):
            tail.silent_reported = True
            # A death is news if the writer wrote recently: a ring left by an engine that died
            # long before this sidecar started is history (its records still fill the ring).
            if now - tail.newest_ts <= self.recent_window:
                sink.emit(
                    Event(
                        kind=EventKind.RECORDER_SILENT,
                        ts=now,
                        source="recorder",
                        severity=Severity.CRITICAL,
                        engine=tail.engine,
                        pid=info.pid,
                        process=tail.role,
                        message=(
                            f"recorder channel of {tail.engine} ({tail.role}, pid {info.pid}) went "
                            f"silent and its process is gone"
                        ),
                        data={"ring": path.name, "last_data_ts": tail.last_data},
                    )
                )
        if tail.silent_reported and now - tail.last_data > self.keep_dead_for:
            try:
                path.unlink()
            except OSError:
                pass
        return emitted
