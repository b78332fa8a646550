"""The sidecar SIGKILLed at every point of a snapshot, then started again: nothing lost, nothing
twice.

A real ``flightrec serve`` (through ``kill_at.py``, which patches the point from outside the
product) watches one engine whose steps are in a real ring file written with the channel's own
writer, and follows a kernel-log file. The test appends an Xid line to that file and asks for a
manual snapshot over HTTP; the wrapper SIGKILLs the process when the chosen trigger's snapshot
reaches the point. The sidecar is then started again, normally, and the database must hold
each trigger's snapshot once, with the trigger's own time, its event row once, and no step twice.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import pytest

from collector.snapshot import intent, spool
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from collector.storage.steps import count_stored_steps
from tests.faults.sidecar_node import SETTLE_S, TOKEN, XID_LINE, Node, query, steps_in, wait_for, xid_accepted

TALLY: list[str] = []

# every point for the kernel's trigger; the manual one (the same path after its intent) and
# Postgres at the points where the database's part differs; 8-12 s a case
CASES = [(p, "xid", "sqlite") for p in ("intent_tmp", "before_spool", "spool_tmp", "after_spool", "in_commit_tx", "after_commit", "in_amend")]
CASES += [(p, "manual", "sqlite") for p in ("before_spool", "after_commit", "in_amend")]
CASES += [(p, "xid", "postgres") for p in ("in_commit_tx", "after_commit")]
CASES += [("before_spool", "xid", "sqlite-dead-engine")]  # the engine died with the fault: retaken from its left ring
PARAMS = [
    pytest.param(p, t, d, id=f"{p}-{t}-{d}", marks=[pytest.mark.slow] + ([pytest.mark.postgres] if d == "postgres" else [])) for p, t, d in CASES
]


@pytest.mark.parametrize(("point", "trigger", "db"), PARAMS)
def test_a_kill_at_each_point_of_a_snapshot_loses_nothing_and_stores_nothing_twice(node: Node, point: str, trigger: str, db: str) -> None:
    proc, base = node.start(point, trigger)
    sent: dict[str, float] = {}  # trigger kind -> when it was given to the sidecar
    acked: set[str] = set()
    try:
        assert wait_for("the ring read", lambda: steps_in(base) >= 300, 30)
        sent["xid"] = time.time()
        with open(node.kmsg, "a") as f:
            f.write(XID_LINE.format(seq=101, us=int(time.monotonic() * 1e6)) + "\n")
        wait_for("the Xid accepted", lambda: xid_accepted(node), 30, proc)
        if proc.poll() is None:
            sent["manual"] = time.time()
            try:
                r = httpx.post(
                    base + "/api/v1/snapshots",
                    json={"engine": "decode-0", "reason": "kill drill"},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=20,
                )
                if r.status_code in (201, 202):
                    acked.add("manual")
            except httpx.HTTPError:
                pass  # killed while the request waited for its commit
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the kill point was never reached:\n{node.output()}"
    assert f"SIGKILL at {point}" in node.output()
    if point == "spool_tmp":  # the kill left a whole temporary file and no spool file
        assert list(node.spool.glob(".snapshot-*.tmp")) and not spool.pending(node.spool)
    if point == "intent_tmp":  # nothing of the fault is durable: the kernel log, read again after its mark, has it
        assert list(node.spool.glob(".trigger-*.intent.tmp")) and not intent.pending(node.spool)
    # the engine goes on after the fault: steps a retake must not put in the fault's snapshot
    restarted_at = time.time()
    node.write_steps(100, restarted_at)

    proc, base = node.start()
    must = {trigger} | acked | {"xid"}
    try:

        def settled() -> bool:
            kinds = {r[0] for r in query(node.db, "SELECT trigger_kind FROM snapshots")}
            return must <= kinds and not intent.pending(node.spool) and not spool.pending(node.spool)

        wait_for("every trigger's snapshot", settled, 60, proc)
        time.sleep(SETTLE_S + 0.3)  # a retaken snapshot is never amended; let anything wrong show
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, node.output()

    snaps = query(node.db, "SELECT id, trigger_kind, trigger_uid, fault_ts, summary FROM snapshots ORDER BY id")
    events = query(node.db, "SELECT uid, kind, ts, snapshot_id FROM events WHERE kind IN ('xid', 'manual')")
    steps = [count_stored_steps(node.db)]
    by_kind: dict[str, list[Any]] = {}
    for s in snaps:  # (a dead engine's ring also makes recorder_silent snapshots, one per start: not ours)
        if s.trigger_kind in ("xid", "manual"):
            by_kind.setdefault(s.trigger_kind, []).append(s)
    stored = {k for k in sent if len(by_kind.get(k, [])) == 1}
    lost = sorted(must - set(by_kind))
    retaken = sorted(s.trigger_kind for s in snaps if _summary(s.summary).get("retaken") and s.trigger_kind in by_kind)
    unanswered = sorted(k for k in sent if k not in must and k not in stored)  # sent as the process died
    # owed: the kernel's line once read, each POST answered, and the trigger killed at the point
    line = (
        f"{point:>12} {trigger:>6} {db:>18}: triggers sent {len(sent)}, owed {len(must)}, stored {len(stored)}, "
        f"lost {len(lost)}, retaken {retaken or 'none'}, not answered and not stored {unanswered or 'none'}; "
        f"snapshots {len(snaps)}, step rows {steps[0][0]} (distinct {steps[0][1]})"
    )
    print(line)
    TALLY.append(line)
    assert not lost, node.output()
    for kind, rows in by_kind.items():
        assert len(rows) == 1, f"{kind}: {len(rows)} snapshots of one trigger"
        snap = rows[0]
        ev = [e for e in events if e.uid == snap.trigger_uid]
        assert len(ev) == 1, f"{kind}: event rows {ev}"  # its event row, once
        assert ev[0].snapshot_id == snap.id and ev[0].kind == kind
        assert snap.fault_ts == pytest.approx(ev[0].ts) and snap.fault_ts < restarted_at  # the fault's own time
        assert kind in sent and sent[kind] - 5 < snap.fault_ts < sent[kind] + 5
        doc = Repository(make_engine(node.db), host="node-k").get_snapshot(snap.id)
        assert doc.steps and doc.steps[-1]["ts"] <= snap.fault_ts + SETTLE_S  # the rings at the fault, not at the restart
        assert doc.steps[-1]["step"] >= 300
    assert sum(1 for e in events if e.kind == "xid") == 1  # the kernel's line, read again after the restart, is the same event
    assert steps[0][0] == steps[0][1] >= node.step == (300 if node.ring is None else 400)  # every step once
    if point == "in_amend":
        assert _summary(by_kind[trigger][0].summary).get("amended_at")  # the spooled amendment committed at restart
    assert not list(node.spool.glob("*.bad")) and not list(node.spool.glob(".*.tmp"))  # nothing set aside or left over


def _summary(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        import json

        return dict(json.loads(value))
    return dict(value or {})
