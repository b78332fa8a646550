"""The recorder folder and ring files: created owner-only, refused when not ours."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from collector.channel.secure import (
    UnsafePathError,
    check_private_file,
    ensure_private_dir,
    open_private_file,
)

OTHER_UID = 54321


def foreign(path: Path) -> dict[str, int]:
    """Make ``path`` another user's: chown it when we are root (root itself is trusted), else
    ask the check for another owner than us. Returns the keyword arguments for the check."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
        return {}
    return {"owner": OTHER_UID}


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0, 0o022, 0o777])
def test_creates_the_folder_owner_only(tmp_path: Path, umask: int) -> None:
    (tmp_path / "a").mkdir()  # the parent as usual: a 0o777 umask would lock a non-root run out
    old = os.umask(umask)  # whatever the umask: permissive, usual, or one that leaves no bit
    try:
        folder = ensure_private_dir(tmp_path / "a" / "flightrec")
    finally:
        os.umask(old)
    assert folder.is_dir() and _mode(folder) == 0o700


def test_our_open_folder_is_tightened(tmp_path: Path) -> None:
    folder = tmp_path / "flightrec"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    ensure_private_dir(folder)
    assert _mode(folder) == 0o700


@pytest.mark.parametrize("kind", ["symlink", "file", "fifo", "dangling"])
def test_refuses_what_is_not_a_folder(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "flightrec"
    target = tmp_path / "elsewhere"
    target.mkdir()
    if kind == "symlink":
        folder.symlink_to(target)
    elif kind == "dangling":
        folder.symlink_to(tmp_path / "missing")
    elif kind == "file":
        folder.write_text("x")
    else:
        os.mkfifo(folder)
    with pytest.raises(UnsafePathError, match="symlink|not a directory"):
        ensure_private_dir(folder)
    assert not (tmp_path / "missing").exists()  # nothing was created through the link


def test_refuses_a_folder_of_another_user(tmp_path: Path) -> None:
    folder = tmp_path / "flightrec"
    folder.mkdir(mode=0o700)
    (folder / "planted.ring").write_bytes(b"x")
    with pytest.raises(UnsafePathError, match="owned by uid .* another user created it first"):
        ensure_private_dir(folder, **foreign(folder))


def test_open_private_file_refuses_fifo_symlink_and_foreign_files(tmp_path: Path) -> None:
    good = tmp_path / "a.ring"
    good.write_bytes(b"x")
    os.close(open_private_file(good))
    fifo = tmp_path / "f.ring"
    os.mkfifo(fifo)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_private_file(fifo)  # returns at once: O_NONBLOCK
    link = tmp_path / "l.ring"
    link.symlink_to(good)
    with pytest.raises(UnsafePathError, match="symlink"):
        open_private_file(link)
    with pytest.raises(UnsafePathError, match="owned by uid"):
        open_private_file(good, **foreign(good))
    with pytest.raises(UnsafePathError):
        check_private_file(os.stat(tmp_path), tmp_path)
