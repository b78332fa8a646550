"""One incident, whole: ``GET /api/v1/incidents/{id}/view`` for the incident page.

An incident groups the snapshots of one fault across engines and hosts (a P/D pair dies
together; a node-wide Xid takes every engine on the GPU). The view joins what each of its
snapshots holds: the hosts and engines, with their P/D pairs and KV roles; one timeline of
every witness (kernel log, NVML, engine logs, scrapes, detectors) across all of them, an
event seen by several snapshots once, with every snapshot that holds it; the snapshots; the
replays linked from them; and the alerts those events page with (what the alert router sends
for them; whether they were delivered is Alertmanager's to say).

Reads only: each snapshot's header and events part, never its steps or request rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from collector.alerting.alerts import alert_for_event
from collector.model import Event, EventKind, Severity
from collector.snapshot.document import unpack

_EVENT_FIELDS = ("kind", "ts", "source", "message", "severity", "engine", "gpu", "xid", "pid", "process")


def incident_view(repo: Any, incident_id: int, *, page_url: Callable[[int], str], public_url: str = "") -> dict[str, Any]:
    """The incident page's data (blocking: run it in a reader thread)."""
    inc = repo.get_incident(incident_id)
    snaps: list[dict[str, Any]] = []
    engines: dict[tuple[str, str], dict[str, Any]] = {}
    timeline: dict[str, dict[str, Any]] = {}
    replays: list[dict[str, Any]] = []
    for row in inc.get("snapshots") or []:
        doc, blobs = repo.get_snapshot_blobs(row["id"], parts=("events", "peers"))
        header = doc.header()
        summary = header.get("summary") or {}
        fp = header.get("fingerprint") or {}
        key = (str(header["host"]), str(header["engine"]))
        eng = engines.setdefault(
            key,
            {
                "host": key[0],
                "engine": key[1],
                "pair": summary.get("pair"),
                "role": fp.get("kv_role"),
                "vllm_version": fp.get("vllm_version"),
                "snapshots": [],
            },
        )
        eng["snapshots"].append(row["id"])
        eng["pair"] = eng["pair"] or summary.get("pair")
        eng["role"] = eng["role"] or fp.get("kv_role")
        trig = header.get("trigger") or {}
        snaps.append(
            {
                "id": row["id"],
                "host": key[0],
                "engine": key[1],
                "created_at": header.get("created_at"),
                "fault_ts": header.get("fault_ts"),
                "trigger_kind": trig.get("kind"),
                "trigger_message": trig.get("message"),
                "step_count": row.get("step_count"),
                "request_rows": row.get("request_rows"),
                "url": page_url(row["id"]),
            }
        )
        for p in unpack(blobs["peers"]) if "peers" in blobs else []:  # the P/D peers, with a snapshot of their own or not
            pk = (str(p.get("host")), str(p.get("engine")))
            peer = engines.setdefault(
                pk,
                {
                    "host": pk[0],
                    "engine": pk[1],
                    "pair": p.get("pair"),
                    "role": p.get("role"),
                    "vllm_version": (p.get("fingerprint") or {}).get("vllm_version"),
                    "snapshots": [],
                },
            )
            peer["role"] = peer["role"] or p.get("role")
            peer["pair"] = peer["pair"] or p.get("pair")
        for r in summary.get("replays") or []:
            replays.append({**r, "of_snapshot": row["id"], "engine": key[1], "host": key[0]})
        for e in unpack(blobs["events"]) if "events" in blobs else []:
            uid = str(e.get("uid") or f"{e.get('kind')}|{e.get('ts')}|{e.get('message')}")
            seen = timeline.get(uid)
            if seen is None:
                seen = timeline[uid] = {k: e.get(k) for k in _EVENT_FIELDS}
                seen["sources"] = list(e.get("sources") or [e.get("source")])
                seen["host"] = key[0]
                seen["snapshots"] = []
                data = e.get("data") or {}
                cat = data.get("catalog")
                if cat:
                    seen["xid_name"] = cat.get("name")
                # who the kubelet gave the faulty GPU to (PodResources): namespace, pod, container
                seen["gpu_holders"] = [
                    {k: str(h.get(k) or "") for k in ("namespace", "pod", "container", "device")}
                    for h in data.get("gpu_holders") or []
                    if isinstance(h, dict)
                ]
            if row["id"] not in seen["snapshots"]:
                seen["snapshots"].append(row["id"])
    events = sorted(timeline.values(), key=lambda e: e.get("ts") or 0.0)
    pairs: dict[str, list[str]] = {}
    for eng in engines.values():
        if eng["pair"]:
            pairs.setdefault(str(eng["pair"]), []).append(f"{eng['host']}/{eng['engine']}")
    faults = [s["fault_ts"] for s in snaps if isinstance(s.get("fault_ts"), (int, float))]
    return {
        "id": inc["id"],
        "title": inc.get("title"),
        "key": inc.get("key"),
        "opened_at": inc.get("opened_at"),
        "updated_at": inc.get("updated_at"),
        "trigger_kind": inc.get("trigger_kind"),
        "first_fault_ts": min(faults) if faults else None,
        "hosts": sorted({k[0] for k in engines}),
        "engines": sorted(engines.values(), key=lambda e: (e["host"], e["engine"])),
        "pairs": pairs,
        "timeline": events,
        "snapshots": snaps,
        "replays": sorted(replays, key=lambda r: r.get("ts") or 0.0),
        "alerts": _alerts(events, snaps, public_url),
    }


def _alerts(events: list[dict[str, Any]], snaps: list[dict[str, Any]], public_url: str) -> list[dict[str, Any]]:
    """The alerts these events page with, one per alert identity, first time first."""
    snap_of = {(s["host"], s["engine"]): s["id"] for s in snaps}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in events:
        ev = _event(e)
        if ev is None:
            continue
        alert = alert_for_event(ev, host=str(e.get("host") or ""), public_url=public_url, snapshot_id=snap_of.get((e.get("host"), e.get("engine"))))
        if alert is None:
            continue
        labels = alert.label_set()
        ident = tuple(sorted(labels.items()))
        if ident in out:
            continue
        out[ident] = {
            "alertname": alert.name,
            "severity": alert.severity.value,
            "starts_at": e.get("ts"),
            "labels": labels,
            "summary": alert.annotations.get("summary"),
            "snapshot_url": alert.generator_url,
        }
    return sorted(out.values(), key=lambda a: a.get("starts_at") or 0.0)


def _event(e: Mapping[str, Any]) -> Event | None:
    try:
        return Event(
            kind=EventKind(e.get("kind")),
            ts=float(e.get("ts") or 0.0),
            source=str(e.get("source") or ""),
            message=str(e.get("message") or ""),
            severity=Severity(e.get("severity") or "warning"),
            engine=e.get("engine"),
            gpu=e.get("gpu"),
            xid=e.get("xid"),
            pid=e.get("pid"),
            process=e.get("process"),
        )
    except (ValueError, TypeError):
        return None
