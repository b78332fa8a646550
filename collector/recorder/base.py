"""Internal: what every engine-side recorder writes besides its per-step records: the deployment
fingerprint and events. ``StatsRecorder`` and ``RequestRecorder`` build on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from collector.channel.wire import encode
from collector.recorder.channel import RecorderChannel
from collector.recorder.env import recorder_dir_from_env
from collector.recorder.identity import EngineIdentity


class RecorderBase:
    """One ring (one role of one engine, in this process). Every ``write_*`` is safe to call
    from the engine's hot path: a fault disables the recorder for good, logs once and never
    raises. ``active`` says whether it still records; ``failed`` says why not."""

    role = "base"

    def __init__(
        self,
        identity: EngineIdentity,
        *,
        directory: str | Path | None = None,
        capacity: int,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.identity = identity
        self.clock = clock
        folder = Path(directory) if directory is not None else recorder_dir_from_env()
        self.channel = RecorderChannel(identity=identity, role=self.role, directory=folder, capacity=capacity, pid=pid, clock=clock)

    @property
    def engine(self) -> str:
        return self.channel.engine

    @property
    def active(self) -> bool:
        return self.channel.active

    @property
    def failed(self) -> str | None:
        return self.channel.failed

    def _emit(self, what: str, encoder: Callable[..., bytes], *args: Any) -> None:
        """One record: ``encoder(*args)`` written to the ring. Every write goes through here, so
        an input the encoder refuses disables the recorder (said once) instead of reaching the
        engine; a recorder already off does nothing, not even the encode."""
        channel = self.channel
        if not channel.active:
            return
        try:
            payload = encoder(*args)
        except Exception as exc:  # noqa: BLE001 - an unencodable value is our fault, not the engine's
            channel.fail(f"{what} raised {exc!r}")
            return
        channel.write(payload)

    def _json(self, what: str, body: dict[str, Any]) -> None:
        self._emit(what, encode, body)

    def write_fingerprint(self, facts: Mapping[str, Any], *, ts: float | None = None) -> None:
        """The engine's deployment facts (one ``fp`` record). The identity's joining facts
        (``server_pid``, ``server_host``, ``server_port``, ``engine_index``) are added unless
        ``facts`` has them."""
        merged = {**self.identity.facts(), **dict(facts)}
        self._json("fingerprint", {"t": "fp", "engine": self.engine, "ts": self.clock() if ts is None else ts, "facts": merged})

    def write_event(
        self,
        kind: str,
        message: str,
        *,
        ts: float | None = None,
        severity: str = "warning",
        **fields: Any,
    ) -> None:
        """An event the engine saw itself (``kind`` is a ``collector.model.EventKind`` value;
        ``fields`` are other ``Event`` fields: pid, process, frames, lines, data, gpu, xid)."""
        body = {
            "t": "ev",
            "engine": self.engine,
            "kind": kind,
            "message": message,
            "severity": severity,
            "source": "recorder",
            "ts": self.clock() if ts is None else ts,
            **fields,
        }
        self._json("event", body)

    def close(self) -> None:
        self.channel.close()
