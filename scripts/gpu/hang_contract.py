"""What the hang detector and the stack capture expose, as the GPU hang phase reads it: the
event kinds (collector/model.py), the engines' ``state`` in /api/v1/engines, the wedge
snapshots and their ``stacks`` part (flightrec.stacks/v1), the page's name. The one place to
change when those change."""

from __future__ import annotations

import json
import re
import urllib.error
from typing import Any

from gpu_tier_lib import Receiver, Sidecar

HANG_EVENT, RESUME_EVENT, HANG_ALERT = "engine_wedged", "engine_resumed", "VllmEngineWedged"


def hang_events(side: Sidecar, engine: str | None, since: float) -> list[dict[str, Any]]:
    """Wedge and resume events since ``since`` (of ``engine``, or of every engine)."""
    q = "/events?limit=500" + (f"&engine={engine}" if engine else "")
    items = side.api(q).get("items") or []
    found = [e for e in items if e.get("kind") in (HANG_EVENT, RESUME_EVENT) and (e.get("ts") or 0) >= since - 1]
    return sorted(found, key=lambda e: e.get("ts") or 0)


def engine_state(side: Sidecar, engine: str) -> dict[str, Any]:
    """The engine's verdict: ``state`` (ok, wedged, down, gpu_fault) and since when, with the
    sidecar's own step count beside it (empty when the sidecar did not answer)."""
    try:
        rows = side.engines()
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    e = next((x for x in rows if x.get("name") == engine), {})
    return {k: e.get(k) for k in ("state", "state_since", "since", "stuck_seconds", "steps_received", "last_step", "running", "waiting")}


def wedge_snapshots(side: Sidecar, engine: str, since: float) -> list[dict[str, Any]]:
    items = side.api(f"/snapshots?engine={engine}").get("items") or []
    found = [s for s in items if s.get("trigger_kind") == HANG_EVENT and (s.get("created_at") or 0) >= since - 1]
    return sorted(found, key=lambda s: s.get("created_at") or 0)


def _walk(x: Any) -> Any:
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def snapshot_hang_view(doc: dict[str, Any], since: float) -> dict[str, Any]:
    """From a hang snapshot: its stacks' status, the engine core's entry (the process whose
    role, title or name says engine core), whether it waits in a GPU synchronisation (its
    blocking frame where the capture names one, else any frame of it), and NVML's view of the
    GPU (the stacks' own readings, else the snapshot's GPU samples taken after ``since``)."""
    stacks = doc.get("stacks")
    out: dict[str, Any] = {
        "has_stacks": bool(stacks),
        "stacks_status": stacks.get("status") if isinstance(stacks, dict) else None,
        "stacks_reasons": (stacks.get("reasons") if isinstance(stacks, dict) else None) or None,
    }
    core: dict[str, Any] | None = None
    for d in _walk(stacks):
        labels = " ".join(str(d.get(k) or "") for k in ("role", "title", "name", "process", "cmdline"))
        if "engine_core" in labels or "EngineCore" in labels:
            core = d
            break
    blocking = (core or {}).get("blocking") or {}
    frame = blocking.get("frame") if isinstance(blocking, dict) else None
    text = json.dumps(core) if core is not None else (json.dumps(stacks) if stacks else "")
    out["engine_core_found"] = core is not None
    out["engine_core_state"] = (core or {}).get("state")
    out["engine_core_blocking_frame"] = frame
    if isinstance(frame, dict) and frame.get("function"):
        out["engine_core_in_sync"] = bool(SYNC.search(str(frame.get("function"))))
    else:
        out["engine_core_in_sync"] = bool(SYNC.search(text))
    out["engine_core_excerpt"] = _sync_excerpt(text)
    utils = [d.get(k) for d in _walk(stacks) for k in ("utilization", "utilization_gpu", "gpu_util", "util") if isinstance(d.get(k), (int, float))]
    samples = [s.get("utilization") for s in doc.get("gpu_samples") or [] if (s.get("ts") or 0) >= since and s.get("utilization") is not None]
    out["nvml_util_in_stacks"] = utils[:8]
    out["nvml_util_in_samples_after_launch"] = samples[-8:]
    out["nvml_busy"] = any(u >= 90 for u in utils) or any(u >= 90 for u in samples)
    return out


SYNC = re.compile(r"synchroni[sz]e|cudaEventSynchronize|cudaStreamSynchronize|cuEventSynchronize|cuStreamSynchronize")


def _sync_excerpt(text: str, width: int = 600) -> str | None:
    m = SYNC.search(text)
    if not m:
        return text[:width] or None
    return text[max(0, m.start() - width // 2) : m.start() + width // 2]


def pages(recv: Receiver, since: float, snapshot_id: int | None) -> list[tuple[float, dict[str, Any]]]:
    """Alerts received since ``since`` that page the wedge (by name, or by the snapshot's link)."""
    out = []
    for ts, a in recv.alerts():
        if ts < since:
            continue
        body = json.dumps(a)
        if (a.get("labels") or {}).get("alertname") == HANG_ALERT or (snapshot_id is not None and f"/snapshots/{snapshot_id}" in body):
            out.append((ts, a))
    return out
