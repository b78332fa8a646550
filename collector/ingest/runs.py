"""Runs of one engine: a restarted engine's steps never share a window with its last run's.

Every step carries its run (``StepRecord.run``: the recorder's run id, the API server's start
time in milliseconds; from a recorder before the run id, its server pid, or what the recorder
source made of a ring replaced under the same name). The engine's step window holds the
current run only; when a step of a newer run arrives, the window is set aside whole as the previous run
(``PreviousRun``: its steps, request blocks and per-second figures as they were, frozen) and a
fresh window follows the new run from its first step. So a snapshot holds one run: the current
one, or the previous one for a trigger of that run (the old ring's death, read after the new run
began), never both.

Which run is newer: run ids that are start times (``RUN_IDS_FROM``) compare as times, so a
catch-up that reads the new run's ring before the old one's (both left in the folder while the
sidecar was down) still ends with the new run current. Any other run id (a pid) is newer when it
is not the previous run: arrival order. A late step of the previous run goes to the previous
run's window; a step of a run older than both is not held (it is still stored).
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.ingest.window import StepWindow

RUN_IDS_FROM = 10**12  # a run id from here up is a start time in ms (2001 on); below, a pid


@dataclass
class PreviousRun:
    run: int
    window: StepWindow
    ended: float  # when the next run's first step arrived (the sidecar's clock)


def newer(run: int, than: int) -> bool:
    """Whether ``run`` began after ``than`` (the module docstring)."""
    if run >= RUN_IDS_FROM and than >= RUN_IDS_FROM:
        return run > than
    return True


def window_for(current: int | None, previous: PreviousRun | None, run: int) -> str:
    """Where a step of ``run`` goes: ``"current"``, ``"previous"``, ``"new"`` (it begins a new
    run: the current window becomes the previous run) or ``"none"`` (an older run: not held)."""
    if current is None or run == current:
        return "current"
    if previous is not None and run == previous.run:
        return "previous"
    if newer(run, current):
        return "new"
    if previous is None or newer(run, previous.run):
        return "previous"  # an ended run read late, newer than any held: becomes the previous run
    return "none"
