"""Internal: one way to put a file on disk for the sidecar's own state (spool files, trigger intents, the
kernel log's resume mark): atomic (a
temporary name, fsynced, renamed: a crash leaves the whole file or none), durable (the folder is
fsynced after the rename), owner-only, and never through a link (a leftover or planted
temporary name is removed, the new one created with ``O_EXCL|O_NOFOLLOW``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def temporary_name(name: str) -> str:
    """The name a file is written under before its rename (swept at start when a kill left it)."""
    return f".{name}.tmp"


def write_file(directory: Path, name: str, chunks: Iterable[bytes]) -> Path:
    """Write ``chunks`` as ``directory/name``; raises OSError (disk full, no permission)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    tmp = directory / temporary_name(name)
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    return path


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
