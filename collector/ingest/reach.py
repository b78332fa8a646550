"""What the sidecar says in its log about the engines it watches: once at start when it watches
none, and once on each change of an engine's reachability (answering, not answering, never
answered since start). A sidecar that records nothing must say why where the operator looks
first; one line per change, never one per scrape.

Pure: ``ReachLog.check`` takes each engine's ``up`` (True, False, or None before its first
answer) and the seconds since start, and returns the lines to log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# An engine that has not answered this long after start is reported as not answering (the
# first scrape comes within a scrape interval; a few seconds more for a slow start).
FIRST_ANSWER_GRACE_S = 15.0

NO_ENGINES = (
    "no engines to watch: nothing will be recorded. Name them under 'engines:' in the settings file "
    "(name, url[, log, gpus, pair]) or in FLIGHTREC_ENGINES"
)


@dataclass(slots=True)
class ReachLog:
    grace_s: float = FIRST_ANSWER_GRACE_S
    _told: dict[str, str] = field(default_factory=dict)  # engine -> the state last said
    _told_none: bool | None = None

    def check(self, up: Mapping[str, bool | None], urls: Mapping[str, str | None], since_start_s: float) -> list[str]:
        lines: list[str] = []
        if not up:
            if self._told_none is not True:
                lines.append(NO_ENGINES)
                self._told_none = True
            return lines
        if self._told_none:
            lines.append(f"now watching {len(up)} engine(s): {', '.join(sorted(up))}")
        self._told_none = False
        for name in sorted(up):
            state = _state(up[name], since_start_s, self.grace_s)
            if state is None or self._told.get(name) == state:
                continue
            before = self._told.get(name)
            self._told[name] = state
            where = f" at {urls.get(name)}" if urls.get(name) else ""
            if state == "up":
                if before is not None:  # an engine answering from the start is not news
                    lines.append(f"engine {name}{where} answers /metrics now")
            elif state == "down":
                lines.append(f"engine {name}{where} does not answer /metrics: no steps or scrapes recorded for it until it does")
            else:
                lines.append(
                    f"engine {name}{where} has not answered /metrics in the {since_start_s:.0f} s since start: "
                    "check its URL in the settings and that vLLM is running"
                )
        return lines


def _state(up: bool | None, since_start_s: float, grace_s: float) -> str | None:
    if up is True:
        return "up"
    if up is False:
        return "down"
    return "never" if since_start_s >= grace_s else None
