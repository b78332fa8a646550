"""Whether the sidecar may read an engine process, decided before py-spy runs (the kernel's rule
and Yama's ptrace_scope), over fake /proc roots; and one line per cause, not per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.stacks import causes, permissions
from collector.stacks.proc import ProcInfo
from tests.stacks import fakeproc


def _target(uid: int) -> ProcInfo:
    return ProcInfo(pid=5, ppid=1, name="VLLM::EngineCor", cmdline=(), uid=uid, nspid=(5,), uids=(uid,) * 4, gids=(uid,) * 4)


@pytest.mark.parametrize(
    ("uid", "cap", "yama", "target_uid", "cause"),
    [
        (0, True, None, 1000, None),  # CAP_SYS_PTRACE reads any uid
        (1000, False, None, 1000, None),  # the same uid needs nothing
        (1000, False, 0, 1000, None),
        (0, False, None, 1000, causes.OTHER_UID),  # root without the capability: another uid is refused
        (1000, False, 1, 1000, causes.YAMA_RESTRICTED),  # py-spy is never the engine's parent
        (1000, True, 1, 1000, None),
        (1000, False, 2, 1000, causes.YAMA_ADMIN_ONLY),
        (0, True, 2, 1000, None),
        (0, True, 3, 0, causes.YAMA_NO_ATTACH),  # nobody
    ],
)
def test_refusal(tmp_path: Path, uid: int, cap: bool, yama: int | None, target_uid: int, cause: str | None) -> None:
    fakeproc.reader(tmp_path, uid=uid, cap_sys_ptrace=cap, yama=yama)
    access = permissions.read_access(tmp_path)
    assert (access.uid, access.cap_sys_ptrace, access.yama_scope) == (uid, cap, yama)
    got = permissions.refusal(access, _target(target_uid))
    assert (got[0] if got else None) == cause


DOCKER_DEFAULT_CAPS = 0xA80425FB  # what a container as root holds unless told otherwise (vLLM's image)
SYSLOG_ONLY = 1 << 34  # the DaemonSet's sidecar before it adds SYS_PTRACE: drop ALL, add SYSLOG


def test_root_without_the_capabilities_of_its_target_is_refused_whatever_the_uid(tmp_path: Path) -> None:
    fakeproc.reader(tmp_path, uid=0, caps=SYSLOG_ONLY)
    access = permissions.read_access(tmp_path)
    assert access.cap_sys_ptrace is False and access.cap_prm == SYSLOG_ONLY
    target = _target(0)
    import dataclasses

    got = permissions.refusal(access, dataclasses.replace(target, cap_prm=DOCKER_DEFAULT_CAPS))
    assert got is not None and got[0] == causes.CAPABILITIES
    assert got[1] == "CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, 10 more"
    assert "add CAP_SYS_PTRACE" in causes.text(*got)
    # with SYS_PTRACE added (the DaemonSet's form), nothing refuses it
    fakeproc.reader(tmp_path / "b", uid=0, caps=SYSLOG_ONLY | 1 << 19)
    assert permissions.refusal(permissions.read_access(tmp_path / "b"), dataclasses.replace(target, cap_prm=DOCKER_DEFAULT_CAPS)) is None
    # a target with no capability (vLLM as a non-root uid) is read by the same uid without any
    fakeproc.reader(tmp_path / "c", uid=1000, caps=0)
    assert permissions.refusal(permissions.read_access(tmp_path / "c"), dataclasses.replace(_target(1000), cap_prm=0)) is None


def test_an_unreadable_status_leaves_the_decision_to_py_spy(tmp_path: Path) -> None:
    access = permissions.read_access(tmp_path)  # no /proc/self at all
    assert access.cap_sys_ptrace is None
    assert permissions.refusal(access, _target(1000)) is None


def test_the_other_uid_line_names_both_uids() -> None:
    access = permissions.Access(uid=0, gid=0, cap_sys_ptrace=False, yama_scope=None)
    got = permissions.refusal(access, _target(1000))
    assert got is not None
    line = causes.text(*got)
    assert "uid 1000" in line and "uid 0" in line and "CAP_SYS_PTRACE" in line


def test_one_line_per_cause_naming_every_process_it_kept_out() -> None:
    failed = [
        (causes.YAMA_RESTRICTED, "", "engine_core 5001"),
        (causes.YAMA_RESTRICTED, "", "worker 5002"),
        (causes.YAMA_RESTRICTED, "", "worker 5003"),
        (causes.TIMEOUT, "py-spy did not answer within 10 s", "api_server 5000"),
    ]
    lines = causes.lines(failed)
    assert len(lines) == 2
    assert lines[0].endswith("[engine_core 5001, worker 5002, worker 5003]") and "ptrace_scope is 1" in lines[0]
    assert "10 s" in lines[1] and lines[1].endswith("[api_server 5000]")
