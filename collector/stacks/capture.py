"""One engine's stacks, read twice a few seconds apart, with its GPUs and its environment: the
I/O around the pure parts of this stage.

``StackReader.capture`` is a coroutine for the event loop that never blocks it: the ``/proc``
reads and every py-spy run happen in the reader's own threads (``parallel`` of them), so a
py-spy that hangs holds one of those, for at most ``timeout_s``, and never a thread the
snapshot's build and commit use. Every process of the engine is read at once; the second round
starts ``interval_s`` after the first began. The whole capture ends within about ``interval_s +
2 x timeout_s`` (``bound_s``), whatever py-spy does.

What it returns is the snapshot's ``stacks`` part (``collector.stacks.part``). What kept a
process from being read is said once per cause (``collector.stacks.causes``), and the rest is
kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from collector.model import GpuSample
from collector.stacks import causes, environ, finder, gpus, part, permissions, pyspy, roles
from collector.stacks import proc as procfs
from collector.stacks.settings import StacksSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
GpuReader = Callable[[], Sequence[GpuSample]]  # the newest sample of each of the engine's GPUs, on the loop


class StackReader:
    def __init__(
        self,
        settings: StacksSettings,
        *,
        recorder_dir: Path | None,
        proc: Path = procfs.PROC,
        binary: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.recorder_dir = recorder_dir
        self.proc = proc
        self.binary = binary if binary is not None else pyspy.find_binary(settings.py_spy)
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=settings.parallel, thread_name_prefix="flightrec-stacks")
        self._version: str | None = None
        self.captures = 0
        self.dumps = 0
        self.dump_failures = 0

    @property
    def bound_s(self) -> float:
        """The longest a capture takes: two rounds of dumps (a native one falling back to a
        non-blocking one: three), the interval, and the /proc reads."""
        return self.settings.interval_s + self.settings.timeout_s * (3 if self.settings.native else 2) + 5.0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def readiness(self) -> str | None:
        """What will keep a wedge's stacks from being read, as far as this process can tell
        before any engine wedges (no py-spy; Yama refusing a reader without CAP_SYS_PTRACE), or
        None."""
        if self.binary is None:
            return "a wedged engine's stacks cannot be read: " + causes.text(causes.PY_SPY_MISSING).removeprefix("stacks not read: ")
        access = permissions.read_access(self.proc)
        if access.cap_sys_ptrace is False and access.yama_scope in (1, 2, 3):
            cause = {1: causes.YAMA_RESTRICTED, 2: causes.YAMA_ADMIN_ONLY, 3: causes.YAMA_NO_ATTACH}[access.yama_scope]
            return "a wedged engine's stacks cannot be read: " + causes.text(cause).removeprefix("stacks not read: ")
        return None

    async def _off(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def capture(self, engine: str, fingerprint: Mapping[str, Any], read_gpus: GpuReader | None = None) -> dict[str, Any]:
        started = self.clock()
        self.captures += 1
        s = self.settings
        if fingerprint.get("simulated"):  # its pids are made up (collector.sim): nothing of it runs to be read
            return part.unavailable("stacks not read: a simulated engine has no processes of its own", started_at=started, finished_at=started)
        try:
            found, access = await self._off(self._find, engine, dict(fingerprint))
        except Exception as exc:  # a /proc that changes under the walk: data, never a raise
            log.exception("finding the processes of %s failed", engine)
            return part.unavailable(f"stacks not read: finding the engine's processes failed ({exc})", started_at=started, finished_at=self.clock())
        if not found.processes:
            return part.unavailable(f"stacks not read: {found.reason}", started_at=started, finished_at=self.clock(), notes=found.notes)
        failed: list[tuple[str, str, str]] = []
        notes = list(found.notes)
        targets: list[finder.EngineProcess] = []
        for p in found.processes:
            if p.role not in roles.DUMPED:
                continue
            refused = permissions.refusal(access, _info(p))
            if refused is not None:
                failed.append((*refused, f"{p.role} {p.pid}"))
            else:
                targets.append(p)
        if targets and self.binary is None:
            failed += [(causes.PY_SPY_MISSING, "", f"{p.role} {p.pid}") for p in targets]
            targets = []
        readings: list[Sequence[GpuSample]] = []
        envs = await self._off(self._environs, [p.pid for p in found.processes if p.role in roles.DUMPED])
        first: dict[int, pyspy.Dump] = {}
        second: dict[int, pyspy.Dump] = {}
        if targets:
            t0 = time.monotonic()
            readings.append(_gpus(read_gpus))
            first = await self._round(targets, native=False)
            await asyncio.sleep(max(0.0, s.interval_s - (time.monotonic() - t0)))
            readings.append(_gpus(read_gpus))
            again = [p for p in targets if first[p.pid].cause != causes.GONE]
            second = await self._round(again, native=s.native)
            if s.native:
                no_native = [p for p in again if not second[p.pid].ok and second[p.pid].cause != causes.GONE]
                if no_native:
                    d = second[no_native[0].pid]
                    notes.append(causes.text(causes.NATIVE, d.error or d.cause or ""))
                    second.update(await self._round(no_native, native=False))
        else:
            readings.append(_gpus(read_gpus))
        for p in targets:
            dumps = [d for d in (first.get(p.pid), second.get(p.pid)) if d is not None]
            bad = [d for d in dumps if not d.ok]
            if bad and len(bad) == len(dumps):
                failed.append((bad[0].cause or causes.FAILED, bad[0].error or "", f"{p.role} {p.pid}"))
        base_pid = next((p.pid for p in found.processes if p.role == roles.ENGINE_CORE and p.pid in envs), None)
        env, diffs = environ.split(envs, base_pid)
        if not envs and any(p.role in roles.DUMPED for p in found.processes):
            notes.append("the engine's environment was not read (/proc/PID/environ needs the same right as its stacks)")
        role_of = {p.pid: p.role for p in found.processes}
        return part.build(
            processes=self._entries(found.processes, first, second, diffs),
            reasons=causes.lines(failed),
            started_at=started,
            finished_at=self.clock(),
            interval_s=s.interval_s,
            tool={"name": "py-spy", "version": await self._tool_version() if any(d.ok for d in (*first.values(), *second.values())) else None},
            env=env,
            gpus=gpus.view(readings, role_of),
            notes=notes,
        )

    def _find(self, engine: str, fingerprint: dict[str, Any]) -> tuple[finder.Found, permissions.Access]:
        found = finder.find(engine, fingerprint, recorder_dir=self.recorder_dir, proc=self.proc, max_processes=self.settings.max_processes)
        return found, permissions.read_access(self.proc)

    def _environs(self, pids: list[int]) -> dict[int, dict[str, str]]:
        out = {}
        for pid in pids:
            env = procfs.read_environ(pid, self.proc)
            if env is not None:
                out[pid] = environ.relevant(env)
        return out

    async def _round(self, targets: Sequence[finder.EngineProcess], *, native: bool) -> dict[int, pyspy.Dump]:
        dumps = await asyncio.gather(*(self._off(pyspy.dump, self.binary, p.pid, native=native, timeout_s=self.settings.timeout_s) for p in targets))
        self.dumps += len(dumps)
        self.dump_failures += sum(1 for d in dumps if not d.ok)
        return {p.pid: d for p, d in zip(targets, dumps, strict=True)}

    def _entries(
        self,
        processes: Sequence[finder.EngineProcess],
        first: Mapping[int, pyspy.Dump],
        second: Mapping[int, pyspy.Dump],
        diffs: Mapping[int, Mapping[str, str | None]],
    ) -> list[dict[str, Any]]:
        return [part.process_entry(p, first.get(p.pid), second.get(p.pid), diffs.get(p.pid)) for p in processes]

    async def _tool_version(self) -> str | None:
        if self._version is None and self.binary is not None:
            self._version = await self._off(pyspy.version, self.binary, self.settings.timeout_s)
        return self._version


def _info(p: finder.EngineProcess) -> procfs.ProcInfo:
    return procfs.ProcInfo(pid=p.pid, ppid=p.ppid, name="", cmdline=(), uid=p.uid, nspid=(p.pid,), uids=p.uids, gids=p.gids, cap_prm=p.cap_prm)


def _gpus(read: GpuReader | None) -> Sequence[GpuSample]:
    if read is None:
        return []
    try:
        return list(read())
    except Exception:  # the GPUs' view is a bonus: never the stacks' end
        log.exception("reading the GPU samples for the stacks failed")
        return []
