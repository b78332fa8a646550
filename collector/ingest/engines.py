"""The engine registry: which engines this node has, and what ingest knows of each.

One record per engine, created when configured or when a record first names it. It is the one
place an engine's up/down state, its counters, its fingerprint and its GPUs (configured, or
learnt from NVML's process lists through the process tree) are kept. Only ingest changes it;
every other stage reads it through the view (``collector.ingest.view``) as frozen
``EngineInfo`` copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from collector.ingest.fingerprints import merge_fingerprint
from collector.ingest.pidmap import PidMap
from collector.ingest.progress import Progress, ProgressBook
from collector.ingest.state import EngineState, StateBook
from collector.ingest.view import EngineInfo
from collector.model import Event


@dataclass
class _Engine:
    name: str
    url: str | None = None
    pair: str | None = None
    gpus: list[int] | None = None
    configured: bool = False
    fingerprint: dict[str, Any] = field(default_factory=dict)
    up: bool | None = None  # the one place engine up/down is kept
    ever_up: bool = False
    last_seen: float | None = None  # newest record from the recorder
    last_scrape_ok: float | None = None
    steps_received: int = 0
    requests_received: int = 0  # request rows, counted per block (no per-row work)
    learned_gpus: set[int] = field(default_factory=set)  # from NVML's process lists
    pod_uid: str | None = None  # the Kubernetes pod discovery found it in
    progress: ProgressBook = field(default_factory=ProgressBook)  # last step, its time, requests held
    marks: StateBook = field(default_factory=StateBook)  # its state's marks (wedge, fault) and since when
    departed_at: float | None = None  # when discovery said it left (collector.ingest.departures)


class EngineRegistry:
    def __init__(self, *, proc_root: Path = Path("/proc")) -> None:
        self._engines: dict[str, _Engine] = {}
        self.pids = PidMap(proc_root)

    def ensure(
        self,
        name: str,
        *,
        url: str | None = None,
        pair: str | None = None,
        gpus: list[int] | None = None,
        configured: bool = False,
        pod_uid: str | None = None,
    ) -> bool:
        """The engine's record exists (True when this call made it); given facts are kept."""
        st = self._engines.get(name)
        made = st is None
        if st is None:
            st = self._engines[name] = _Engine(name)
        if url is not None:
            st.url = url
        if pair is not None:
            st.pair = pair
        if gpus is not None:
            st.gpus = list(gpus)
        if configured:
            st.configured = True
            st.departed_at = None  # (discovery registers a pod of that name again)
        if pod_uid is not None:
            st.pod_uid = pod_uid.lower()
        return made

    def departed(self, name: str, ts: float) -> None:
        """The engine left (its pod is gone): forgotten after a grace period, unless it comes back."""
        st = self._engines[name]
        st.up = False
        if st.departed_at is None:
            st.departed_at = ts

    def departed_before(self, ts: float) -> list[str]:
        return [st.name for st in self._engines.values() if st.departed_at is not None and st.departed_at <= ts]

    def forget(self, name: str) -> None:
        self._engines.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._engines

    def __len__(self) -> int:
        return len(self._engines)

    def names(self) -> list[str]:
        return list(self._engines)

    # -- what ingest learns ---------------------------------------------------------------------
    def saw_step(
        self,
        name: str,
        ts: float,
        request_rows: int,
        halves: int = 1,
        *,
        step: int | None = None,
        held: int | None = None,
        held_ts: float | None = None,
    ) -> None:
        """``halves``: 2 for a step whose two halves came as one record (the recorder source
        pairs the halves it reads in one poll): each half counts as received. ``step``: the
        newest step's number; ``held``: running + waiting of the newest step that carries them
        (read at ``held_ts``): the engine's progress (``collector.ingest.progress``)."""
        st = self._engines[name]
        st.steps_received += halves
        st.requests_received += request_rows
        st.last_seen = ts
        st.up = st.ever_up = True
        if step is not None:
            st.progress.saw_steps(step, ts, held, held_ts)

    def saw_scrape(self, name: str, ts: float, values: dict[str, float] | None = None, paused: bool | None = None) -> None:
        st = self._engines[name]
        st.up = st.ever_up = True
        st.last_scrape_ok = ts
        if values is not None:
            st.progress.saw_scrape(ts, values, paused)

    def saw_event(self, name: str, ev: Event) -> None:
        """An event routed to the engine: a wedge, its end, a crash or a GPU fault marks its state."""
        self._engines[name].marks.saw_event(ev)

    def progress(self, name: str) -> Progress | None:
        st = self._engines.get(name)
        return st.progress.read() if st is not None else None

    def state(self, name: str, now: float) -> EngineState | None:
        st = self._engines.get(name)
        if st is None:
            return None
        return st.marks.state(now, up=st.up, configured=st.configured, progress=st.progress.read())

    def went_down(self, name: str) -> None:
        self._engines[name].up = False

    def set_fingerprint(self, name: str, facts: dict[str, Any]) -> None:
        """Both recorders' facts are kept (the API server's and the engine core's)."""
        st = self._engines[name]
        st.fingerprint = merge_fingerprint(st.fingerprint, facts)

    def fingerprint(self, name: str) -> dict[str, Any]:
        st = self._engines.get(name)
        return dict(st.fingerprint) if st is not None else {}

    def learn_gpus(self, index: int, processes: list[Any]) -> None:
        """NVML lists the processes on GPU ``index``: the engines they belong to run on it."""
        known = self.engine_pids()
        for proc in processes:
            pid = proc.get("pid") if isinstance(proc, dict) else None
            name = self.pids.engine_of(pid, known)
            for owner in (name,) if name is not None else self.pod_engines(pid):
                self._engines[owner].learned_gpus.add(index)

    # -- what routing asks ------------------------------------------------------------------------
    def gpus_of(self, name: str) -> set[int]:
        st = self._engines[name]
        return set(st.gpus) if st.gpus is not None else set(st.learned_gpus)

    def owner_of(self, pid: int | None) -> str | None:
        """The engine whose process tree holds ``pid`` (a GPU fault's worker), or None."""
        return self.pids.engine_of(pid, self.engine_pids())

    def owners_of(self, pid: int | None) -> tuple[str, ...]:
        """The engines ``pid`` belongs to: the one whose process tree holds it, else those of the
        Kubernetes pod it runs in (its cgroup; a pod's data-parallel engines are all its own)."""
        owner = self.owner_of(pid)
        return (owner,) if owner is not None else self.pod_engines(pid)

    def pod_engines(self, pid: object) -> tuple[str, ...]:
        """The engines of the pod ``pid`` runs in: discovered in that pod, or whose recorder says
        it runs there (``pod_uid`` in its fingerprint, with the ``/dp<i>`` engines of a pod)."""
        if not isinstance(pid, int) or pid <= 1:
            return ()
        pods = {n: u for n, st in self._engines.items() if (u := st.pod_uid or st.fingerprint.get("pod_uid"))}
        if not pods:  # no engine in a pod (a bare process, compose): no cgroup to read
            return ()
        uid = self.pids.pod_of(pid)
        if uid is None:
            return ()
        return tuple(n for n, u in pods.items() if u == uid)

    def engine_pids(self) -> dict[int, str]:
        """Known engine processes: the recorder's fingerprint carries the API server's pid."""
        out = {}
        for name, st in self._engines.items():
            for key in ("server_pid", "pid"):
                pid = st.fingerprint.get(key)
                if isinstance(pid, int) and pid > 1:
                    out[pid] = name
        return out

    def info(self, name: str) -> EngineInfo | None:
        st = self._engines.get(name)
        if st is None:
            return None
        return EngineInfo(
            name=st.name,
            url=st.url,
            pair=st.pair,
            configured=st.configured,
            up=st.up,
            ever_up=st.ever_up,
            last_seen=st.last_seen,
            last_scrape_ok=st.last_scrape_ok,
            steps_received=st.steps_received,
            requests_received=st.requests_received,
            gpus=frozenset(self.gpus_of(name)),
            gpus_configured=st.gpus is not None,
            fingerprint=MappingProxyType(dict(st.fingerprint)),
        )
