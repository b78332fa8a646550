"""Internal: the recorder folder and its ring files belong to us: owner-only, no symlink, regular files.

The folder lives in ``/dev/shm`` by default, which every local user can write and which is
emptied at boot: whoever creates ``/dev/shm/flightrec`` first owns it. Were it another user, they
could plant ring files (fake steps, a fake ``cuda_error`` that commits a snapshot), read ours,
or leave a symlink where the engine writes. So both sides check before they use it:

- ``ensure_private_dir(path)`` creates the folder ``0700`` (parents as usual) or checks the one
  there: a real directory (not a symlink), owned by us or root, and no more open than ``0700``
  (ours is tightened, root's is refused if others may write into it);
- ``open_private_file(path)`` opens a file for reading without following a symlink and without
  blocking on a FIFO, and checks that it is a regular file owned by us or root;
- ``check_private_file(st, path)`` is that check on an ``os.stat_result``.

Root is trusted because it can do all of this anyway. Every refusal raises ``UnsafePathError``
with one line saying what was found and what to do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from collector.errors import FlightrecError

DIR_MODE = 0o700
FILE_MODE = 0o600
_ROOT = 0


class UnsafePathError(FlightrecError, OSError):
    """The recorder folder or a file in it is not ours to trust."""


def _trusted(uid: int, owner: int | None) -> bool:
    expected = os.geteuid() if owner is None else owner
    return uid in (expected, _ROOT)


def ensure_private_dir(path: str | os.PathLike[str], *, owner: int | None = None) -> Path:
    """Create ``path`` owner-only, or check the folder already there; return it.

    ``owner`` is the uid that must own it (default: this process's effective uid; root is
    accepted too). Raises UnsafePathError for a symlink, a non-directory, a folder of another
    user, or a root folder that others may write into; OSError when it cannot be created.
    """
    folder = Path(path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(folder)  # lstat: a symlink is judged as itself, never through its target
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"recorder folder {folder} is a symlink; remove it or choose another folder")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"recorder folder {folder} is not a directory; remove it or choose another folder")
    if not _trusted(st.st_uid, owner):
        raise UnsafePathError(
            f"recorder folder {folder} is owned by uid {st.st_uid}, not by us: another user created it first; "
            "remove it or set FLIGHTREC_RECORDER_DIR to a folder of ours"
        )
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == os.geteuid():
        if mode != DIR_MODE:
            os.chmod(folder, DIR_MODE)  # ours, made before this version or under another umask
    elif mode & 0o077:
        raise UnsafePathError(f"recorder folder {folder} is open to other users (mode {mode:o}); make it 0700 or choose another folder")
    return folder


def check_private_file(st: os.stat_result, path: str | os.PathLike[str], *, owner: int | None = None) -> None:
    """Raise UnsafePathError unless ``st`` is a regular file owned by us (or root)."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path} is not a regular file (a FIFO, device or folder); ignored")
    if not _trusted(st.st_uid, owner):
        raise UnsafePathError(f"{path} is owned by uid {st.st_uid}, not by us; ignored")


def open_private_file(path: str | os.PathLike[str], *, owner: int | None = None) -> int:
    """Open ``path`` read-only and return the descriptor, after the checks of this module.

    O_NOFOLLOW refuses a symlink; O_NONBLOCK makes ``open`` of a FIFO return at once instead of
    waiting for a writer (which hung the sidecar's loop); the file type and owner are then
    checked on the descriptor itself (fstat), so nothing can be swapped in between.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePathError(f"{path} is a symlink; ignored") from exc
        raise
    try:
        check_private_file(os.fstat(fd), path, owner=owner)
    except BaseException:
        os.close(fd)
        raise
    return fd
