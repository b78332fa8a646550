"""One open snapshot's life: its states and every transition between them, in one place.

A snapshot of one engine is opened by a trigger (``OpenSnapshot.opened``, or at start
``from_spool`` and ``retaken``) and its state has two parts, held together in one frozen
``Life`` value that each transition replaces:

- ``Stored``, what the database holds of it: ``PENDING`` until its first version is committed,
  then ``COMMITTED``; ``DUPLICATE`` when its trigger's snapshot was stored before (a restarted
  sidecar read a dead engine's ring again: nothing more is stored); ``REFUSED`` when the
  database refused it for good (its amendment, a fresh capture, may still commit it).
- ``Amendment``: ``DUE`` until the trigger policy takes it, ``settle_s`` after the capture, then
  ``TAKEN``; ``NONE`` for a snapshot that has none (a trigger read again at start, a retaken
  intent, a spooled first version an earlier run left).

Its window: late witnesses of the same fault join it (``join``) until ``until``; from then on it
is closed to them, whatever its state.

====================  =========================================  ==========================
transition            from                                       to
====================  =========================================  ==========================
``join``              any state, window open                     same state, one more witness
``take_amendment``    amendment ``DUE``                          amendment ``TAKEN``
``commit_first``      ``PENDING``, ``REFUSED``                   ``COMMITTED``
``found_stored``      ``PENDING``, ``REFUSED``                   ``DUPLICATE``
``commit_amendment``  ``COMMITTED`` with amendment ``TAKEN``     unchanged (the row amended)
``refuse``            ``PENDING``, ``REFUSED``                   ``REFUSED``
                      ``COMMITTED`` (its amendment refused)      unchanged
====================  =========================================  ==========================

A transition from any other state raises ``IllegalTransition``. Beside the state, a snapshot
keeps where its durability stands (its trigger's intent file, its spool file, the last error):
those change through the methods under "durability" below, never by assignment (every field is
read-only from outside).

Usage (what the trigger policy and the commit queue do)::

    o = OpenSnapshot.opened("decode-0", trigger, until=now + window_s, gpu=None, run=3)
    o.join(witness, gpu=None, now=now)  # same fault, another witness
    o.take_amendment()                  # settle_s later: captured again, queued
    o.commit_first(snapshot_id)         # the first version is in the database
    o.commit_amendment(snapshot_id)     # and its amendment
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from collector.model import Event
from collector.snapshot import intent

__all__ = ["Amendment", "IllegalTransition", "Life", "OpenSnapshot", "Stored"]


class Stored(enum.Enum):
    PENDING = "pending"
    COMMITTED = "committed"
    DUPLICATE = "duplicate"
    REFUSED = "refused"


class Amendment(enum.Enum):
    DUE = "due"
    TAKEN = "taken"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Life:
    """An open snapshot's state: what is stored of it, and its amendment."""

    stored: Stored = Stored.PENDING
    amendment: Amendment = Amendment.DUE


class IllegalTransition(RuntimeError):
    """A transition asked of a snapshot in a state it does not start from (a bug, never input)."""


class OpenSnapshot:
    """One fault's snapshot of one engine, from its trigger until its window closes."""

    __slots__ = (
        "_error",
        "_gpus",
        "_intent_path",
        "_late",
        "_life",
        "_snapshot_id",
        "_spool_error",
        "_spool_path",
        "_stacks",
        "_trigger",
        "_waiters",
        "engine",
        "retake",
        "run",
        "until",
    )
    engine: str
    until: float  # its window: late witnesses join before this time
    run: int | None  # the engine's run it is of (``collector.ingest.runs``; None: not known)
    retake: intent.Intent | None  # the intent it was retaken from at start (None: opened by this run)

    def __init__(
        self,
        engine: str,
        trigger: Event,
        until: float,
        *,
        life: Life | None = None,
        gpus: Iterable[str] = (),
        run: int | None = None,
        snapshot_id: int | None = None,
        spool_path: Path | None = None,
        intent_path: Path | None = None,
        retake: intent.Intent | None = None,
    ) -> None:
        # set once here, never changed after (``__setattr__``)
        object.__setattr__(self, "engine", engine)
        object.__setattr__(self, "until", until)
        object.__setattr__(self, "run", run)
        object.__setattr__(self, "retake", retake)
        self._waiters: asyncio.Future[int] | None = None
        self._trigger = trigger
        self._late: list[Event] = []
        self._gpus = set(gpus)  # the GPUs whose faults it holds (``IngestView.gpu_key``)
        self._life = life or Life()
        self._snapshot_id = snapshot_id
        self._spool_path = spool_path
        self._intent_path = intent_path
        self._error = ""
        self._spool_error = ""
        self._stacks: asyncio.Future[dict[str, Any]] | None = None

    def __setattr__(self, name: str, value: object) -> None:
        if not name.startswith("_"):
            raise AttributeError(f"OpenSnapshot.{name} is read-only: it changes through a transition")
        object.__setattr__(self, name, value)

    # -- the ways a snapshot starts ---------------------------------------------------------------
    @classmethod
    def opened(cls, engine: str, trigger: Event, until: float, *, gpu: str | None, run: int | None, replayed: bool = False) -> OpenSnapshot:
        """Opened by a trigger on the loop; a replayed trigger (read again at start) has no amendment."""
        o = cls(
            engine, trigger, until, life=Life(amendment=Amendment.NONE if replayed else Amendment.DUE), gpus=() if gpu is None else (gpu,), run=run
        )
        with contextlib.suppress(RuntimeError):  # no loop (a tool): nobody can wait for it
            o._waiters = asyncio.get_running_loop().create_future()
        return o

    @classmethod
    def from_spool(cls, engine: str, trigger: Event, *, snapshot_id: int | None, spool_path: Path, intent_path: Path | None) -> OpenSnapshot:
        """A spooled version an earlier run left: a first version, or the amendment of a stored one."""
        life = Life(Stored.COMMITTED, Amendment.TAKEN) if snapshot_id is not None else Life(Stored.PENDING, Amendment.NONE)
        return cls(engine, trigger, 0.0, life=life, snapshot_id=snapshot_id, spool_path=spool_path, intent_path=intent_path)

    @classmethod
    def retaken(cls, it: intent.Intent) -> OpenSnapshot:
        """A trigger an earlier run accepted and did not commit, retaken from the rings at start."""
        return cls(it.engine, it.event, 0.0, life=Life(amendment=Amendment.NONE), intent_path=it.path, retake=it)

    # -- reading -------------------------------------------------------------------------------------
    @property
    def life(self) -> Life:
        return self._life

    @property
    def committed(self) -> asyncio.Future[int] | None:
        """Whoever waits for its id (a manual request) awaits this: done with the id once it is
        committed, found stored before, or refused (0 without an id); None when opened off the loop."""
        return self._waiters

    @property
    def trigger(self) -> Event:
        return self._trigger

    @property
    def late(self) -> tuple[Event, ...]:
        return tuple(self._late)

    @property
    def gpus(self) -> frozenset[str]:
        return frozenset(self._gpus)

    @property
    def snapshot_id(self) -> int | None:
        return self._snapshot_id

    @property
    def amended(self) -> bool:
        """Its amendment is decided: taken, or none due (a distinct fault after this opens its own)."""
        return self._life.amendment is not Amendment.DUE or self._life.stored is Stored.DUPLICATE

    @property
    def duplicate(self) -> bool:
        return self._life.stored is Stored.DUPLICATE

    @property
    def spool_path(self) -> Path | None:
        return self._spool_path

    @property
    def intent_path(self) -> Path | None:
        return self._intent_path

    @property
    def error(self) -> str:
        return self._error

    @property
    def spool_error(self) -> str:
        return self._spool_error

    @property
    def stacks(self) -> asyncio.Future[dict[str, Any]] | None:
        """A wedge's stacks being read (its amendment holds them); None for any other trigger."""
        return self._stacks

    def is_open(self, now: float) -> bool:
        return now < self.until

    def holds(self, ev: Event) -> bool:
        return ev is self._trigger or any(ev is e for e in self._late) or (bool(ev.uid) and ev.uid in self.uids())

    def uids(self) -> set[str]:
        return {e.uid for e in (self._trigger, *self._late) if e.uid}

    def xids(self) -> set[int]:
        return {e.xid for e in (self._trigger, *self._late) if e.xid is not None}

    def __repr__(self) -> str:
        life = f"{self._life.stored.value}, amendment {self._life.amendment.value}"
        return f"OpenSnapshot({self.engine!r}, {self._trigger.kind.value}, {life}, id {self._snapshot_id})"

    # -- transitions ---------------------------------------------------------------------------------
    def join(self, ev: Event, *, gpu: str | None, now: float) -> None:
        """Another witness of the same fault, while the window is open."""
        if not self.is_open(now):
            raise IllegalTransition(f"{self!r}: its window closed at {self.until:.3f}; {ev.kind.value} cannot join it")
        self._late.append(ev)
        if gpu is not None:
            self._gpus.add(gpu)

    def replace_witness(self, ev: Event) -> None:
        """Hold ``ev`` in place of the event with its id (a later witness of an Xid merged into it)."""
        if self._trigger.uid == ev.uid:
            self._trigger = ev
        self._late = [ev if e.uid == ev.uid else e for e in self._late]

    def take_amendment(self) -> None:
        """Captured again ``settle_s`` after the first capture, queued: the only amendment."""
        self._require(self._life.amendment is Amendment.DUE and self._life.stored is not Stored.DUPLICATE, "take its amendment")
        self._life = replace(self._life, amendment=Amendment.TAKEN)

    def commit_first(self, snapshot_id: int) -> None:
        """Its first version is in the database, with id ``snapshot_id``."""
        self._require(self._life.stored in (Stored.PENDING, Stored.REFUSED), "commit its first version")
        self._life = replace(self._life, stored=Stored.COMMITTED)
        self._snapshot_id = snapshot_id
        self._error = ""
        self._resolve()

    def found_stored(self, snapshot_id: int) -> None:
        """Its trigger's snapshot was stored before (id ``snapshot_id``): nothing more is stored."""
        self._require(self._life.stored in (Stored.PENDING, Stored.REFUSED), "be found stored before")
        self._life = replace(self._life, stored=Stored.DUPLICATE)
        self._snapshot_id = snapshot_id
        self._error = ""
        self._resolve()

    def commit_amendment(self, snapshot_id: int) -> None:
        """Its amendment is in the database (the row of its first version, amended)."""
        self._require(
            self._life.stored is Stored.COMMITTED and self._life.amendment is Amendment.TAKEN and snapshot_id == self._snapshot_id,
            f"commit an amendment to snapshot {snapshot_id}",
        )
        self._error = ""

    def refuse(self, error: str) -> None:
        """The database refused it for good (an amendment of a committed one: its first version stands)."""
        self._require(self._life.stored in (Stored.PENDING, Stored.REFUSED, Stored.COMMITTED), "be refused")
        if self._life.stored is not Stored.COMMITTED:
            self._life = replace(self._life, stored=Stored.REFUSED)
        self._error = error
        self._resolve()

    def _require(self, ok: bool, what: str) -> None:
        if not ok:
            raise IllegalTransition(f"{self!r} cannot {what}")

    def _resolve(self) -> None:
        if self._waiters is not None and not self._waiters.done():
            self._waiters.set_result(self._snapshot_id or 0)

    # -- durability (where its trigger and its capture are held; not its state) ----------------------
    def intent_written(self, path: Path) -> None:
        self._intent_path = path

    def intent_not_written(self, error: str) -> None:
        self._error = error

    def intent_removed(self) -> None:
        self._intent_path = None

    def spooled(self, path: Path) -> None:
        self._spool_path = path
        self._spool_error = ""

    def spool_failed(self, error: str) -> None:
        """Its spool write failed: held in memory only."""
        self._spool_path = None
        self._spool_error = error

    def spool_removed(self, path: Path) -> None:
        """The spool file at ``path`` is gone (committed): forgotten if it is the one held."""
        if self._spool_path == path:
            self._spool_path = None

    def commit_failed(self, error: str) -> None:
        """A commit attempt failed (the database is down, hung, full): held and retried."""
        self._error = error

    def stacks_reading(self, stacks: asyncio.Future[dict[str, Any]]) -> None:
        """A wedge's stacks are being read for it (once)."""
        if self._stacks is not None:
            raise IllegalTransition(f"{self!r} already reads its stacks")
        self._stacks = stacks
