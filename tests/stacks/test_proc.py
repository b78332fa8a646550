"""The /proc parsers over real texts, and the reads over a fake tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.stacks import proc
from tests.stacks import fakeproc

# /proc/PID/status of a vLLM engine core in a container, as a node in the host pid namespace reads it
STATUS = """Name:\tVLLM::EngineCor
Umask:\t0022
State:\tS (sleeping)
Tgid:\t48231
Ngid:\t0
Pid:\t48231
PPid:\t48213
TracerPid:\t0
Uid:\t1000\t1000\t1000\t1000
Gid:\t1000\t1000\t1000\t1000
FDSize:\t256
Groups:\t
NSpid:\t48231\t74
NSpgid:\t48213\t1
CapInh:\t0000000000000000
CapPrm:\t0000000000000000
CapEff:\t00000000a80425fb
"""
# what setproctitle leaves in /proc/PID/cmdline (the rest of argv's area is NULs)
TITLE = b"VLLM::EngineCore" + b"\0" * 200


def test_status_fields() -> None:
    st = proc.parse_status(STATUS)
    assert (st.name, st.ppid, st.uids, st.gids, st.nspid) == ("VLLM::EngineCor", 48213, (1000,) * 4, (1000,) * 4, (48231, 74))
    assert st.state == "S"
    assert st.cap_eff == 0xA80425FB
    assert not st.cap_eff >> 19 & 1  # Docker's default set: no CAP_SYS_PTRACE


@pytest.mark.parametrize(
    ("raw", "argv"),
    [
        (TITLE, ("VLLM::EngineCore",)),
        (
            b"python3\0-m\0vllm.entrypoints.openai.api_server\0--port\x008000\0",
            ("python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"),
        ),
        (b"", ()),
        (b"VLLM::Worker_TP1   \0\0", ("VLLM::Worker_TP1   ",)),
    ],
)
def test_cmdline(raw: bytes, argv: tuple[str, ...]) -> None:
    assert proc.parse_cmdline(raw) == argv


def test_environ_keeps_values_with_equals_and_drops_junk() -> None:
    env = proc.parse_environ(b"NCCL_DEBUG=INFO\0URL=http://u:p@h/?a=b\0junk\0\0")
    assert env == {"NCCL_DEBUG": "INFO", "URL": "http://u:p@h/?a=b"}


def test_maps_inode_matches_device_and_inode() -> None:
    maps = (
        "55d0c2a00000-55d0c2a21000 r--p 00000000 fe:00 260386      /usr/bin/python3.11\n"
        "7f2c5a000000-7f2c5a400000 rw-s 00000000 00:1a 3071       /dev/shm/flightrec/decode-0.stats.1.ring\n"
    )
    assert proc.maps_inode(maps, (0, 0x1A), 3071)
    assert not proc.maps_inode(maps, (0, 0x1B), 3071)  # another tmpfs, same inode number
    assert not proc.maps_inode(maps, (0, 0x1A), 307)


def test_scan_reads_a_fake_tree_and_skips_what_vanished(tmp_path: Path) -> None:
    fakeproc.add(tmp_path, 10, ppid=1, cmdline=["vllm", "serve", "m"], nspid=(10, 1), uid=1000)
    fakeproc.add(tmp_path, 11, ppid=10, cmdline=["VLLM::EngineCore"], nspid=(11, 7))
    (tmp_path / "12").mkdir()  # a process that exited between the listing and the read
    table = proc.scan(tmp_path)
    assert sorted(table) == [10, 11]
    assert table[10].own_pid == 1 and table[10].uid == 1000 and table[10].title == "vllm serve m"
    assert table[11].ppid == 10 and table[11].own_pid == 7
    assert proc.read_environ(12, tmp_path) is None
