"""One fault, one event: merge the kernel log's and NVML's reports of the same Xid.

On the H200 both witnesses of a fault arrive within 2 ms of each other (gpu-facts), the
kernel line carrying pid and process name, the NVML event only the code. The hub offers
every event to ``XidMerger.offer``:

- ``(event, True)``: a new fault (or not an Xid at all): publish it. An Xid's event is given
  its witness's time in ``data["witnesses"]`` first (as routing gives it its id: before it is
  filed);
- ``(merged, False)``: the same fault seen by another witness: ``merged`` is a new event, the
  one published with the new source in ``sources``, its missing pid, name, UUID and the
  witness's own time in ``data["witnesses"]``, under the same ``uid``: whoever holds the
  published one replaces it, nothing new is published.

Events are never changed once published: a merge builds a new one.

Two reports are one fault when they name the same GPU (canonical bus id; a UUID is
mapped to its bus id through ``alias``) and the same Xid, within ``window_s`` of each
other, and come from different sources: two lines from the same source are two faults
(a process can fault twice in a row). A lost GPU (GPU_LOST, or Xid 79) is one fault per
GPU per window whatever reports it, since the kernel prints two lines for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from collector.model import Event, EventKind, Severity

_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
_LOST = "lost"


@dataclass(slots=True)
class _Seen:
    event: Event
    first_ts: float


class XidMerger:
    def __init__(self, window_s: float = 2.0, *, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock = clock
        self._recent: list[_Seen] = []
        self._alias: dict[str, str] = {}  # UUID -> canonical bus id

    def alias(self, uuid: str, bus_id: str) -> None:
        """Teach the merger that ``uuid`` is the GPU at ``bus_id`` (canonical form)."""
        self._alias[uuid] = bus_id

    def _gpu(self, event: Event) -> str | None:
        gpu = event.gpu
        if gpu is not None and gpu in self._alias:
            return self._alias[gpu]
        return gpu

    @staticmethod
    def _fault(event: Event) -> int | str | None:
        if event.kind is EventKind.GPU_LOST or event.xid == 79:
            return _LOST
        return event.xid

    def offer(self, event: Event) -> tuple[Event, bool]:
        if event.kind not in (EventKind.XID, EventKind.GPU_LOST):
            return event, True
        self._expire()
        gpu, fault = self._gpu(event), self._fault(event)
        for seen in self._recent:
            prior = seen.event
            if self._gpu(prior) != gpu or self._fault(prior) != fault:
                continue
            if abs(event.ts - seen.first_ts) > self.window_s:
                continue
            if fault != _LOST and event.source in prior.sources:
                continue  # the same witness twice: a second fault
            seen.event = merged = _merged(prior, event)
            return merged, False
        self._recent.append(_Seen(event, event.ts))
        event.data.setdefault("witnesses", {})[event.source] = event.ts  # not filed yet
        return event, True

    def _expire(self) -> None:
        # Keep what could still match an event stamped "now"; sources stamp on arrival.
        horizon = self._clock() - 2 * self.window_s
        self._recent = [s for s in self._recent if s.first_ts >= horizon]


def _merged(prior: Event, new: Event) -> Event:
    """``prior`` with what ``new``, another witness of its fault, adds: a new event."""
    sources = prior.sources if new.source in prior.sources else [*prior.sources, new.source]
    data = dict(prior.data)
    data["witnesses"] = witnesses = dict(data.get("witnesses") or {})
    witnesses.setdefault(new.source, new.ts)
    for key, value in new.data.items():
        if key != "witnesses" and data.get(key) is None and value is not None:
            data[key] = value
    lines = list(prior.lines)
    for line in new.lines:
        if line not in lines:
            lines.append(line)
    message = prior.message
    # the kernel's line says more than NVML's summary
    if new.source == "kmsg" and prior.source != "kmsg":
        data.setdefault("nvml_message", prior.message)
        message = new.message
    return replace(
        prior,
        kind=EventKind.GPU_LOST if new.kind is EventKind.GPU_LOST else prior.kind,
        severity=new.severity if _RANK[new.severity] > _RANK[prior.severity] else prior.severity,
        message=message,
        pid=prior.pid if prior.pid is not None else new.pid,
        xid=prior.xid if prior.xid is not None else new.xid,
        process=prior.process if prior.process is not None else new.process,
        data=data,
        lines=lines,
        sources=list(sources),
    )
