"""Why a process's stacks could not be read: one key per cause, and what py-spy's errors mean.

A snapshot says each cause once, in one line, with the processes it kept from being read
(``lines``): eight workers of another uid are one line, not eight. py-spy's own messages
(``translate``), as py-spy 0.4 prints them on stderr:

    Permission Denied: Try running again with elevated permissions by going 'sudo env "PATH=$PATH" !!'
    Error: Failed to get process executable name. Check that the process is running.
    Error: Failed to find python version from target process
    Can't get native stack traces with the --nonblocking option.
"""

from __future__ import annotations

from collections.abc import Iterable

PY_SPY_MISSING = "py_spy_missing"
OTHER_UID = "other_uid"
CAPABILITIES = "capabilities"
YAMA_RESTRICTED = "yama_restricted"
YAMA_ADMIN_ONLY = "yama_admin_only"
YAMA_NO_ATTACH = "yama_no_attach"
DENIED = "denied"
GONE = "gone"
NOT_PYTHON = "not_python"
TIMEOUT = "timeout"
BAD_OUTPUT = "bad_output"
FAILED = "failed"
NATIVE = "native"  # native frames not read (the Python frames were)

# permission causes: the deployment is missing a right (docs/deploy.md, "Reading stacks")
PERMISSION = frozenset({OTHER_UID, CAPABILITIES, YAMA_RESTRICTED, YAMA_ADMIN_ONLY, YAMA_NO_ATTACH, DENIED})

FIX = "docs/deploy.md, Reading stacks"


def text(cause: str, detail: str = "") -> str:
    """The one line a snapshot shows for a cause (``detail``: what only this instance knows)."""
    lines = {
        PY_SPY_MISSING: f"stacks not read: py-spy is not installed beside the sidecar (pip install py-spy, or set stacks.py_spy){_d(detail)}",
        OTHER_UID: f"stacks not read: {detail or 'the processes run as another uid'} and the sidecar lacks CAP_SYS_PTRACE: "
        f"run it as that uid or add CAP_SYS_PTRACE ({FIX})",
        CAPABILITIES: f"stacks not read: the engine's processes hold capabilities the sidecar does not ({detail or '?'}) and it "
        f"lacks CAP_SYS_PTRACE, which reading a process that holds more capabilities than the reader needs, whatever the uid: "
        f"add CAP_SYS_PTRACE ({FIX})",
        YAMA_RESTRICTED: "stacks not read: kernel.yama.ptrace_scope is 1 (a process may read only its own descendants) and the sidecar lacks "
        f"CAP_SYS_PTRACE: add CAP_SYS_PTRACE ({FIX})",
        YAMA_ADMIN_ONLY: "stacks not read: kernel.yama.ptrace_scope is 2 (only CAP_SYS_PTRACE may read another process) "
        f"and the sidecar lacks it ({FIX})",
        YAMA_NO_ATTACH: "stacks not read: kernel.yama.ptrace_scope is 3: no process may read another on this node until it reboots",
        DENIED: f"stacks not read: the kernel refused py-spy{_d(detail)} (a seccomp or LSM profile, or a process that is not dumpable; {FIX})",
        GONE: "stacks not read: the process exited before py-spy read it",
        NOT_PYTHON: f"stacks not read: not a Python process py-spy can read{_d(detail)}",
        TIMEOUT: f"stacks not read: {detail or 'py-spy did not answer in time'}; it was killed",
        BAD_OUTPUT: f"stacks not read: {detail or 'py-spy gave no dump'}",
        FAILED: f"stacks not read: py-spy failed{_d(detail)}",
        NATIVE: f"native frames not read ({detail or 'py-spy refused'}): Python frames only",
    }
    return lines.get(cause, f"stacks not read: {cause}{_d(detail)}")


def _d(detail: str) -> str:
    return f" ({detail})" if detail else ""


def translate(stderr: str, *, native: bool = False) -> tuple[str, str]:
    """``(cause, the one line py-spy said)`` from its stderr (pure)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((ln for ln in lines if ln.startswith(("Error:", "Permission Denied"))), lines[0] if lines else "no message")
    said = said.removeprefix("Error: ")[:300]
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low or "(os error 1)" in low or "(os error 13)" in low:
        return DENIED, said
    if "check that the process is running" in low or "no such process" in low or "(os error 3)" in low:
        return GONE, said
    if "failed to find python version" in low or "failed to find a python interpreter" in low or "not a python" in low:
        return NOT_PYTHON, said
    if native and "native" in low:
        return NATIVE, said
    return FAILED, said


def lines(failed: Iterable[tuple[str, str, str]]) -> list[str]:
    """One line per cause: ``failed`` holds ``(cause, detail, who)``; each line ends with the
    processes it names (``who``: ``engine_core 4242``), the first detail standing for all."""
    by: dict[str, tuple[str, list[str]]] = {}
    for cause, detail, who in failed:
        first, names = by.setdefault(cause, (detail, []))
        if who not in names:
            names.append(who)
    return [f"{text(cause, detail)} [{', '.join(names)}]" for cause, (detail, names) in by.items()]
