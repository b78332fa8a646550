"""Snapshots waiting for the database, as files: written before the commit is tried, so a
database that is down, hung or full, or a sidecar killed mid-commit, loses nothing.

A spool file is the snapshot's stored form (the header and the parts' blobs exactly as the
database rows hold them), written to a temporary file, fsynced and renamed into place, so a
crash leaves either a whole file or none. Reading one back checks everything; a file that is
not whole (a disk that filled, a foreign file) is moved aside as ``*.bad`` with a log line,
and the rest of the spool goes on.

Layout: ``FLSPOOL2\\n``, one JSON line (the header, the incident key, the event uid), then for
each part ``name\\n`` + ``<length>\\n`` + the blob; finally ``END\\n``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector import durable
from collector.errors import FlightrecError

log = logging.getLogger(__name__)

MAGIC = b"FLSPOOL2\n"
END = b"END\n"
MAX_PART = 1 << 31


class SpoolError(FlightrecError):
    """A spool file that is not whole or not ours."""


@dataclass
class Spooled:
    path: Path
    header: dict[str, Any]
    meta: dict[str, Any]  # incident key, trigger uid, snapshot id once committed
    blobs: dict[str, bytes]


def write(directory: Path, name: str, header: dict[str, Any], meta: dict[str, Any], blobs: dict[str, bytes]) -> Path:
    """Write atomically; raises OSError (disk full, no permission) for the caller to report."""

    def chunks() -> Iterator[bytes]:
        yield MAGIC
        yield json.dumps({"header": header, "meta": meta}, default=str).encode() + b"\n"
        for part, blob in blobs.items():
            yield part.encode() + b"\n" + str(len(blob)).encode() + b"\n"
            yield blob
        yield END

    return durable.write_file(directory, name, chunks())


def read(path: Path) -> Spooled:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpoolError(f"{path.name}: {exc}") from exc
    if not data.startswith(MAGIC) or not data.endswith(END):
        raise SpoolError(f"{path.name}: not a whole spool file ({len(data)} bytes)")
    pos = len(MAGIC)
    nl = data.find(b"\n", pos)
    if nl < 0:
        raise SpoolError(f"{path.name}: no header")
    try:
        head = json.loads(data[pos:nl])
        header, meta = dict(head["header"]), dict(head["meta"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # deep nesting: json.loads recurses
        raise SpoolError(f"{path.name}: bad header: {type(exc).__name__}: {str(exc)[:200]}") from exc
    pos = nl + 1
    blobs: dict[str, bytes] = {}
    end = len(data) - len(END)
    while pos < end:
        nl1 = data.find(b"\n", pos)
        nl2 = data.find(b"\n", nl1 + 1) if nl1 >= 0 else -1
        if nl1 < 0 or nl2 < 0:
            raise SpoolError(f"{path.name}: truncated part header")
        part = data[pos:nl1].decode("ascii", "replace")
        try:
            length = int(data[nl1 + 1 : nl2])
        except ValueError as exc:
            raise SpoolError(f"{path.name}: bad part length") from exc
        if not 0 <= length <= MAX_PART or nl2 + 1 + length > end:
            raise SpoolError(f"{path.name}: part {part} runs past the file")
        blobs[part] = data[nl2 + 1 : nl2 + 1 + length]
        pos = nl2 + 1 + length
    return Spooled(path, header, meta, blobs)


def pending(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("snapshot-*.spool") if p.is_file() and not p.is_symlink())


def set_aside(path: Path, reason: str) -> None:
    log.error("spooled snapshot %s is unreadable (%s): moved aside as %s.bad", path.name, reason, path.name)
    try:
        path.rename(path.with_name(path.name + ".bad"))
    except OSError:
        pass
