"""The database file is the sidecar's record of every crash: owner-only whatever the umask,
and a silent (stopped) database server never holds a caller past the watchdog."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.watchdog import HangWatchdog


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_sqlite_file_and_its_wal_and_shm_are_owner_only_and_new_folders_0700(tmp_path: Path) -> None:
    old = os.umask(0)  # a umask that hides nothing: the modes are ours, not the umask's
    try:
        db = tmp_path / "made" / "by" / "us" / "flightrec.db"
        url = f"sqlite:///{db}"
        upgrade(url)
        engine = make_engine(url)
        with engine.begin() as conn:  # a connection open: the -wal and -shm files exist
            conn.execute(text("CREATE TABLE IF NOT EXISTS probe (x INTEGER)"))
            conn.execute(text("INSERT INTO probe VALUES (1)"))
            wal, shm = db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")
            assert wal.exists() and shm.exists()
            assert {p.name: mode(p) for p in (db, wal, shm)} == {db.name: 0o600, wal.name: 0o600, shm.name: 0o600}
        engine.dispose()
        assert [mode(p) for p in (tmp_path / "made", tmp_path / "made" / "by", db.parent)] == [0o700] * 3
    finally:
        os.umask(old)


def test_an_existing_folder_and_file_keep_their_modes(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    db = folder / "f.db"
    db.touch()
    db.chmod(0o640)  # the operator's choice (a read-only dashboard group)
    make_engine(f"sqlite:///{db}").dispose()
    assert (mode(folder), mode(db)) == (0o755, 0o640)


def test_the_watchdog_cuts_a_statement_that_gets_no_answer(tmp_path: Path) -> None:
    """A peer that accepts bytes and never answers (as a SIGSTOPped server's kernel does): the
    blocked reader wakes with EOF once the watchdog shuts its socket."""
    ours, silent = socket.socketpair()
    dog = HangWatchdog(0.5, tick_s=0.05)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(ours.recv(100)), daemon=True)
    t0 = time.monotonic()
    dog.arm(1, ours.fileno())
    ours.sendall(b"SELECT 1")  # accepted, never answered
    reader.start()
    reader.join(10)
    waited = time.monotonic() - t0
    assert not reader.is_alive() and got == [b""]  # woke with EOF
    assert 0.5 <= waited < 5 and dog.shut == 1 and dog.oldest_wait_s() is None
    ours.close()
    silent.close()


def test_the_watchdog_leaves_answered_statements_alone() -> None:
    ours, peer = socket.socketpair()
    dog = HangWatchdog(0.2, tick_s=0.05)
    dog.arm(1, ours.fileno())
    assert dog.oldest_wait_s() is not None
    dog.disarm(1)
    time.sleep(0.4)
    peer.sendall(b"ok")
    assert ours.recv(10) == b"ok" and dog.shut == 0
    ours.close()
    peer.close()


@pytest.mark.postgres
def test_postgres_statements_are_watched_while_in_flight(pg_url: str) -> None:
    """The hooks see real psycopg statements: armed while one runs, disarmed when it answers."""
    from collector.storage.connect import hang_watchdog

    engine = make_engine(pg_url)
    dog = hang_watchdog(engine)
    assert dog is not None
    waits: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            w = dog.oldest_wait_s()
            if w is not None:
                waits.append(w)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        with engine.connect() as conn:
            sampler.start()
            conn.execute(text("SELECT pg_sleep(0.5)"))
            done.set()
            after = dog.oldest_wait_s()
    finally:
        done.set()
        engine.dispose()
    assert waits and max(waits) >= 0.3  # seen in flight
    assert after is None and dog.shut == 0  # answered: disarmed, nothing cut
