"""py-spy: finding its binary, one dump of one process, and what its output and errors mean.

``py-spy dump --nonblocking --json --pid P`` reads the process's memory without stopping it
(``process_vm_readv``, which the kernel allows with the same permission as ``ptrace``: the same
uid or ``CAP_SYS_PTRACE``, and Yama's ``ptrace_scope``). ``--native`` unwinds the C/C++ frames
too (a CUDA synchronise, an NCCL wait under ``torch.distributed``), but py-spy refuses it
without pausing the process ("Can't get native stack traces with the --nonblocking option"):
a native dump stops each thread for the length of the dump.

The binary comes with the ``py-spy`` wheel, installed next to the Python scripts of the
sidecar's environment. A dump is a subprocess with a time bound: a py-spy that hangs is killed,
and the sidecar never waits on it past ``timeout_s``.

Parsing is pure (``parse_dump``, over JSON recorded from a real py-spy 0.4 in
``tests/fixtures/stacks/``): each thread of the process, innermost frame first, as py-spy
gives them::

    [{"pid": 10648, "thread_id": 140494136654720, "thread_name": "MainThread",
      "os_thread_id": 10648, "active": false, "owns_gil": false,
      "frames": [{"name": "wait_for_the_lock", "filename": "/tmp/blk.py", "module": null,
                  "short_filename": "blk.py", "line": 5, "locals": null, ...}, ...]}, ...]

A native frame has ``module`` set (the library: ``/usr/lib/x86_64-linux-gnu/libc.so.6``) and
line 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.stacks import causes
from collector.stacks.paths import short_path

BINARY = "py-spy"
MAX_OUTPUT = 16 * 1024 * 1024  # a dump's JSON past this is refused (thousands of threads)
# py-spy reads no settings of ours: none of the sidecar's environment (its token, its database
# URL) goes to it; no Rust backtrace in its errors (collector.stacks.causes reads the first line)
SUBPROCESS_ENV = {"RUST_BACKTRACE": "0", "LC_ALL": "C"}


@dataclass(frozen=True, slots=True)
class Frame:
    function: str
    file: str
    line: int
    native: bool = False

    @property
    def short(self) -> str:
        return short_path(self.file)

    def key(self) -> tuple[str, str]:
        """What makes two frames the same place in the code, whatever line it is at."""
        return self.function, self.file

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"function": self.function, "file": self.short, "line": self.line}
        if self.native:
            out["native"] = True
        return out


@dataclass(frozen=True, slots=True)
class ThreadStack:
    tid: int  # the OS thread id (what top -H and a native debugger show)
    name: str | None
    active: bool  # py-spy: on a CPU (not waiting in a known idle call)
    owns_gil: bool
    frames: tuple[Frame, ...]  # innermost first

    @property
    def python(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if not f.native)


@dataclass
class Dump:
    """One py-spy run over one process: its threads, or why there are none."""

    pid: int
    started: float
    seconds: float
    threads: list[ThreadStack] = field(default_factory=list)
    native: bool = False
    cause: str | None = None  # collector.stacks.causes key when it failed
    error: str | None = None  # the one line py-spy said

    @property
    def ok(self) -> bool:
        return self.cause is None


def find_binary(configured: str | None = None) -> str | None:
    """The py-spy to run: the configured path, the one installed beside this Python (the wheel's
    scripts folder, which a virtual environment's PATH may not hold), then PATH."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / BINARY
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(BINARY)


def parse_dump(text: str) -> list[ThreadStack]:
    """The threads of ``py-spy dump --json`` output. Raises ValueError when it is not that."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy's dump is not a list of threads")
    out = []
    for t in data:
        if not isinstance(t, dict):
            raise ValueError("py-spy's dump holds a thread that is not an object")
        frames = tuple(
            Frame(
                function=str(f.get("name") or "?"),
                file=str(f.get("filename") or f.get("module") or "?"),
                line=int(f.get("line") or 0),
                native=f.get("module") is not None,
            )
            for f in t.get("frames") or []
            if isinstance(f, dict)
        )
        tid = t.get("os_thread_id") or t.get("thread_id") or 0
        out.append(
            ThreadStack(
                tid=int(tid),
                name=str(t["thread_name"]) if t.get("thread_name") else None,
                active=bool(t.get("active")),
                owns_gil=bool(t.get("owns_gil")),
                frames=frames,
            )
        )
    return out


def command(binary: str, pid: int, *, native: bool) -> list[str]:
    return [binary, "dump", "--json", "--pid", str(pid), "--native" if native else "--nonblocking"]


def dump(binary: str | None, pid: int, *, native: bool = False, timeout_s: float = 10.0) -> Dump:
    """One dump of one process, blocking the calling thread at most ``timeout_s`` (run it off
    the event loop). Failures are data: ``Dump.cause`` and its one line."""
    started = time.time()
    t0 = time.monotonic()
    if binary is None:
        return Dump(pid, started, 0.0, cause=causes.PY_SPY_MISSING, error="py-spy is not installed")
    try:
        p = subprocess.Popen(
            command(binary, pid, native=native),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=SUBPROCESS_ENV,
            start_new_session=True,  # a kill reaches py-spy alone, never the sidecar's group
        )
    except OSError as exc:
        return Dump(pid, started, time.monotonic() - t0, native=native, cause=causes.PY_SPY_MISSING, error=f"cannot run {binary}: {exc}")
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(p)
        return Dump(pid, started, time.monotonic() - t0, native=native, cause=causes.TIMEOUT, error=f"py-spy did not answer within {timeout_s:g} s")
    seconds = time.monotonic() - t0
    if p.returncode != 0:
        cause, line = causes.translate(err.decode("utf-8", "replace"), native=native)
        return Dump(pid, started, seconds, native=native, cause=cause, error=line)
    if len(out) > MAX_OUTPUT:
        return Dump(pid, started, seconds, native=native, cause=causes.BAD_OUTPUT, error=f"py-spy's dump is {len(out)} bytes, over {MAX_OUTPUT}")
    try:
        threads = parse_dump(out.decode("utf-8", "replace"))
    except (ValueError, TypeError) as exc:
        return Dump(pid, started, seconds, native=native, cause=causes.BAD_OUTPUT, error=f"py-spy's output is not a dump: {exc}"[:300])
    return Dump(pid, started, seconds, threads=threads, native=native)


def version(binary: str | None, timeout_s: float = 5.0) -> str | None:
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.decode("utf-8", "replace").strip()
    return text.split()[-1] if text else None


def _kill(p: subprocess.Popen[bytes]) -> None:
    """Kill a py-spy that did not answer, and wait for it a little: a child stuck in the kernel
    is left behind rather than waited on for ever."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        p.kill()
    try:
        p.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass
