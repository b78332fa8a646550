"""Two dumps of one process, a few seconds apart, thread by thread: which frames moved, which did
not, and where the process is blocked (pure).

A thread's frames are compared from the outermost in (the thread's start, its loop, ...): the
frames both dumps share, at the same line, did not move; the ones inside them did. A thread
whose whole stack is the same in both dumps is **stuck**; its **blocking frame** is its
innermost Python frame, and ``in`` is the innermost frame outside Python's own library and the
package the blocking frame is in (the ``vllm/...`` frame that called ``threading.Condition.wait``
or ``zmq``'s ``Poller.poll``).

A thread is **idle** when py-spy saw it off the CPU in both dumps and it is a helper thread (a
thread pool worker waiting for work, a socket reader) or a main thread whose event loop waits
for I/O (the API server at rest). The main thread of the engine core and of
each worker, where the engine's step runs, is never idle: the engine held requests when the
snapshot was taken, so that thread should have moved (``roles.STEP_ROLES``). A process's **lead**
thread is the one a reader looks at first: a stuck thread that is not idle, the main thread
(where the step runs, or the API server's event loop) before others, then one holding the GIL,
then one on the CPU.

Python frames only are compared: a native dump (``--native``) adds the C/C++ frames under the
innermost Python frame, shown as they were in the second dump.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collector.stacks.paths import is_stdlib, package_of
from collector.stacks.pyspy import Frame, ThreadStack

STUCK = "stuck"  # the same stack in both dumps, not idle
MOVING = "moving"  # the stack changed between the dumps
IDLE = "idle"  # a helper thread waiting for work, in both dumps
NEW = "new"  # in the second dump only
GONE = "gone"  # in the first dump only
ONE_DUMP = "one_dump"  # only one dump was read: nothing to compare

ORDER = {STUCK: 0, MOVING: 1, ONE_DUMP: 2, NEW: 3, GONE: 4, IDLE: 5}


@dataclass
class ThreadView:
    tid: int
    name: str | None
    main: bool
    state: str
    active: tuple[bool | None, bool | None]  # py-spy's "on a CPU", first and second dump
    owns_gil: bool
    frames: list[Frame]  # the newest dump's, innermost first
    unchanged: list[bool]  # per frame of ``frames``: the same in both dumps (native: False)
    first_frames: list[Frame] | None = None  # the first dump's, when the thread moved
    blocking: int | None = None  # index in ``frames`` of the blocking frame (stuck threads)

    def blocking_frame(self) -> Frame | None:
        return self.frames[self.blocking] if self.blocking is not None else None

    def caller(self) -> Frame | None:
        """Who waits there: when the blocking frame is in Python's own library or in another
        installed package (``threading``, ``zmq``), the innermost frame outside both (the
        ``vllm/...`` frame that called ``Condition.wait`` or ``Poller.poll``); else itself."""
        if self.blocking is None:
            return None
        top = self.frames[self.blocking]
        lib = package_of(top.file)
        if lib is None:
            return top
        for f in self.frames[self.blocking + 1 :]:
            if not f.native and not is_stdlib(f.file) and package_of(f.file) != lib:
                return f
        return None

    def to_dict(self) -> dict[str, Any]:
        frames = []
        for f, same in zip(self.frames, self.unchanged, strict=True):
            d = f.to_dict()
            if not f.native and self.state not in (ONE_DUMP, NEW, GONE):  # native frames are not compared
                d["moved"] = not same
            frames.append(d)
        out: dict[str, Any] = {
            "tid": self.tid,
            "name": self.name,
            "main": self.main,
            "state": self.state,
            "active": list(self.active),
            "owns_gil": self.owns_gil,
            "blocking": self.blocking,
            "frames": frames,
        }
        if self.first_frames is not None:
            out["first_frames"] = [f.to_dict() for f in self.first_frames]
        return out


def compare(
    first: Sequence[ThreadStack] | None,
    second: Sequence[ThreadStack] | None,
    *,
    pid: int,
    step_process: bool,
) -> list[ThreadView]:
    """The threads of one process, lead first. Either dump may be missing (it failed)."""
    a = {t.tid: t for t in first or ()}
    b = {t.tid: t for t in second or ()}
    both = first is not None and second is not None
    out = []
    for tid in list(b) + [t for t in a if t not in b]:
        t1, t2 = a.get(tid), b.get(tid)
        newest = t2 or t1
        assert newest is not None
        main = tid == pid
        frames = list(newest.frames)
        view = ThreadView(
            tid=tid,
            name=newest.name,
            main=main,
            state=ONE_DUMP,
            active=(t1.active if t1 else None, t2.active if t2 else None),
            owns_gil=newest.owns_gil,
            frames=frames,
            unchanged=[False] * len(frames),
        )
        if both and t1 is None:
            view.state = NEW
        elif both and t2 is None:
            view.state = GONE
        elif t1 is not None and t2 is not None:
            view.unchanged = _unchanged(t1.frames, t2.frames)
            same = _python(t1.frames) == _python(t2.frames)
            idle = not t1.active and not t2.active and not (step_process and main) and (not main or _in_event_loop(t2.frames))
            view.state = IDLE if idle else STUCK if same else MOVING
            if not same:
                view.first_frames = list(t1.frames)
        if view.state in (STUCK, ONE_DUMP):
            view.blocking = next((i for i, f in enumerate(frames) if not f.native), None)
        out.append(view)
    out.sort(key=lambda v: (ORDER[v.state], not v.main, not v.owns_gil, not any(x for x in v.active if x), v.tid))
    return out


# An event loop waiting for I/O: the API server's main thread at rest (asyncio's selector, or
# uvloop, whose loop runs in C under ``run_until_complete``).
_LOOP_FILES = ("selectors.py", "asyncio/base_events.py", "asyncio/runners.py", "uvloop/__init__.py")


def _in_event_loop(frames: Sequence[Frame]) -> bool:
    top = next((f for f in frames if not f.native), None)
    return top is not None and top.file.endswith(_LOOP_FILES)


def _python(frames: Sequence[Frame]) -> list[tuple[str, str, int]]:
    return [(f.function, f.file, f.line) for f in frames if not f.native]


def _unchanged(before: Sequence[Frame], after: Sequence[Frame]) -> list[bool]:
    """Per frame of ``after`` (innermost first): the same place, at the same line, in ``before``,
    counted from the outermost frame in, over Python frames (native ones: False)."""
    pa = [f for f in before if not f.native]
    pb_idx = [i for i, f in enumerate(after) if not f.native]
    out = [False] * len(after)
    for k in range(1, min(len(pa), len(pb_idx)) + 1):
        fa, fb = pa[-k], after[pb_idx[-k]]
        if fa.key() != fb.key():
            break
        if fa.line != fb.line:
            break
        out[pb_idx[-k]] = True
    return out


@dataclass
class ProcessVerdict:
    state: str  # stuck | moving | idle | unknown (one dump) | unread
    lead: ThreadView | None = None
    threads: list[ThreadView] = field(default_factory=list)

    def blocking(self) -> dict[str, Any] | None:
        """The process's blocking frame, as the page and the API name it."""
        lead = self.lead
        frame = lead.blocking_frame() if lead is not None else None
        if lead is None or frame is None:
            return None
        caller = lead.caller()
        return {
            "tid": lead.tid,
            "thread": lead.name,
            "state": lead.state,
            "frame": frame.to_dict(),
            "in": caller.to_dict() if caller is not None and caller is not frame else None,
        }


def verdict(threads: list[ThreadView]) -> ProcessVerdict:
    if not threads:
        return ProcessVerdict("unread")
    lead = threads[0]
    if lead.state == STUCK:
        return ProcessVerdict(STUCK, lead, threads)
    if lead.state == ONE_DUMP:
        return ProcessVerdict("unknown", lead, threads)
    if any(t.state == MOVING for t in threads):
        return ProcessVerdict(MOVING, None, threads)
    return ProcessVerdict(IDLE, None, threads)
