"""Trigger intents: a trigger made durable the moment the committer accepts it, before its
snapshot is captured, spooled or committed.

The kernel log and the engine logs are followed from their end after a restart, and a manual
request is gone with its HTTP connection: without this record a sidecar killed between seeing
a trigger and spooling its snapshot loses the trigger, its event row and its snapshot. With it,
the next start finds every intent whose snapshot was not committed and takes the snapshot again
from the recorder rings (which outlive the sidecar), with the trigger's own time and fault.

One small file per trigger and engine, in the spool folder: written to a temporary name,
fsynced, renamed into place and the folder fsynced (so the name survives a power cut), mode
0600. It is removed once the snapshot and the trigger's event row are committed. A torn or
foreign file is moved aside as ``*.bad`` (one log line), like a spool file.

Layout: ``FLINTENT1\\n``, one JSON line (``{"engine", "accepted_at", "event": Event fields}``),
``<crc32 of that line, 8 hex digits>\\n``, ``END\\n``.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector import durable
from collector.errors import FlightrecError
from collector.model import Event, EventKind, Severity

log = logging.getLogger(__name__)

MAGIC = b"FLINTENT1\n"
END = b"END\n"
SUFFIX = ".intent"
MAX_SIZE = 1 << 20  # an event of a few KiB; anything larger is not ours


class IntentError(FlightrecError):
    """An intent file that is not whole or not ours."""


@dataclass
class Intent:
    path: Path
    engine: str
    accepted_at: float
    event: Event


def file_name(engine: str, ev: Event) -> str:
    return f"trigger-{ev.ts:.6f}{_tail(engine, ev.uid)}"


def _tail(engine: str, uid: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in engine)[:64]
    return f"-{safe}-{uid[:16]}{SUFFIX}"


def encode(engine: str, ev: Event, accepted_at: float) -> bytes:
    body = json.dumps({"engine": engine, "accepted_at": accepted_at, "event": ev.to_dict()}, default=str).encode()
    return MAGIC + body + b"\n" + f"{zlib.crc32(body):08x}".encode() + b"\n" + END


def decode(path: Path, data: bytes) -> Intent:
    """Pure: the bytes of one intent file; raises IntentError on anything not whole."""
    if not data.startswith(MAGIC) or not data.endswith(END):
        raise IntentError(f"{path.name}: not a whole intent file ({len(data)} bytes)")
    lines = data[len(MAGIC) : -len(END)].split(b"\n")
    if len(lines) != 3 or lines[2] != b"":
        raise IntentError(f"{path.name}: not an intent file")
    body, crc = lines[0], lines[1]
    if crc != f"{zlib.crc32(body):08x}".encode():
        raise IntentError(f"{path.name}: checksum mismatch")
    try:
        doc = json.loads(body)
        ev = event_from_dict(doc["event"])
        engine, accepted_at = str(doc["engine"]), float(doc["accepted_at"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # deep nesting: json.loads recurses
        raise IntentError(f"{path.name}: bad record: {type(exc).__name__}: {str(exc)[:200]}") from exc
    if not ev.uid:
        raise IntentError(f"{path.name}: the event has no id")
    return Intent(path, engine, accepted_at, ev)


def event_from_dict(e: dict[str, Any]) -> Event:
    """An ``Event.to_dict`` back into an event; raises KeyError, TypeError, ValueError."""
    return Event(
        kind=EventKind(e["kind"]),
        ts=float(e["ts"]),
        source=str(e["source"]),
        message=str(e.get("message", "")),
        severity=Severity(e.get("severity", "warning")),
        engine=e.get("engine"),
        gpu=e.get("gpu"),
        xid=e.get("xid"),
        pid=e.get("pid"),
        process=e.get("process"),
        frames=list(e.get("frames") or []),
        lines=list(e.get("lines") or []),
        data=dict(e.get("data") or {}),
        sources=list(e.get("sources") or []),
        uid=str(e.get("uid") or ""),
    )


def write(directory: Path, engine: str, ev: Event, accepted_at: float) -> Path:
    """Atomic and durable; raises OSError (disk full, no permission) for the caller to report."""
    return durable.write_file(directory, file_name(engine, ev), [encode(engine, ev, accepted_at)])


def read(path: Path) -> Intent:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise IntentError(f"{path.name}: {exc}") from exc
    try:
        data = os.read(fd, MAX_SIZE + 1)
    except OSError as exc:
        raise IntentError(f"{path.name}: {exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_SIZE:
        raise IntentError(f"{path.name}: larger than {MAX_SIZE} bytes")
    return decode(path, data)


def pending(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob(f"trigger-*{SUFFIX}") if p.is_file() and not p.is_symlink())


def pending_for(directory: Path, engine: str, uid: str) -> bool:
    """Whether an intent of this engine and trigger id is on disk (whatever its time)."""
    tail = _tail(engine, uid)
    return bool(uid) and any(p.name.endswith(tail) for p in pending(directory))


def remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:  # a leftover intent is retaken, and the retake is idempotent
        log.warning("cannot remove trigger intent %s: %s", path.name, exc)


def set_aside(path: Path, reason: str) -> None:
    log.error("trigger intent %s is unreadable (%s): moved aside as %s.bad", path.name, reason, path.name)
    try:
        path.rename(path.with_name(path.name + ".bad"))
    except OSError:
        pass


def to_meta(intent: Intent) -> dict[str, Any]:
    """What a retaken snapshot's summary says about its trigger's acceptance."""
    return {"accepted_at": intent.accepted_at, "intent": intent.path.name}
