"""One engine's fingerprint from the facts its two recorders write.

The stat logger writes its facts from the API-server process and the ``RecordingScheduler`` from
the engine core (``scheduler_base``, the class it really runs on, is known only there). Each
fact's record carries the writer's ``pid`` and the API server's ``server_pid``: the engine core's
``pid`` is not its server's. Both halves of one server merge, the API server's values winning
where both say something; a new ``server_pid`` or a new ``run`` (a restart under the same pids,
as a container's) is a new engine process and starts afresh.
"""

from __future__ import annotations

from typing import Any


def _in_engine_core(facts: dict[str, Any]) -> bool:
    pid = facts.get("pid")
    return pid is not None and pid != facts.get("server_pid")


def _new_run(old: dict[str, Any], new: dict[str, Any]) -> bool:
    runs = old.get("run"), new.get("run")
    return None not in runs and runs[0] != runs[1]  # (a half without one, of an older recorder: the same)


def merge_fingerprint(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    if not old or old.get("server_pid") != new.get("server_pid") or _new_run(old, new):
        return dict(new)
    if _in_engine_core(new) == _in_engine_core(old):
        return {**old, **new}  # the same side again: its newer facts
    core, api = (new, old) if _in_engine_core(new) else (old, new)
    return {**core, **api, "engine_core_pid": core.get("pid")}
