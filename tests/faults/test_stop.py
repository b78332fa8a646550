"""A graceful stop (SIGTERM) of a real ``flightrec serve``: a snapshot held in memory only (its
spool write failed like a full disk) while the database is down is spooled again or committed at
the stop; what neither takes is logged as lost, with its engine, trigger and time, and the
process exits 1; its trigger's intent survives and the next start retakes it. An amendment not
due yet at the stop is committed before the process exits, with nothing failing at shutdown."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from collector.snapshot import intent, spool
from tests.faults.sidecar_node import TOKEN, XID_LINE, Node, query, wait_for

DOWN = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens: the database is down


def _with_database(node: Node, url: str) -> None:
    doc = node.config.read_text().replace(f"database: {node.db}", f"database: {url}")
    node.config.write_text(doc)
    node.db = url


def _manual(base: str) -> httpx.Response:
    return httpx.post(
        base + "/api/v1/snapshots", json={"engine": "decode-0", "reason": "stop drill"}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )


@pytest.mark.slow
def test_a_memory_only_snapshot_and_a_database_down_at_stop_is_logged_as_lost_and_retaken_at_the_next_start(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    working = node.db
    _with_database(node, DOWN)
    monkeypatch.setenv("FLIGHTREC_SPOOL_FAILS", "1000")  # every spool write fails, at the stop too
    proc, base = node.start(wrapper=True)
    try:
        r = _manual(base)
        # answered only once the trigger is durable: its intent is on disk when the 202 comes
        assert r.status_code == 202 and r.json()["status"] == "accepted"
        assert [p.name for p in intent.pending(node.spool)]
        assert not spool.pending(node.spool)
    finally:
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    out = node.output()
    assert proc.returncode == 1, out  # a service manager shows the unit failed
    assert time.time() - t0 < 40  # bounded: the drain, then the last spool and commit attempts
    lost = [line for line in out.splitlines() if "SNAPSHOT LOST at stop" in line]
    assert len(lost) == 1 and "engine decode-0, trigger manual at " in lost[0] and "stop drill" in lost[0]
    assert "retaken from the rings at the next start" in lost[0]
    assert "Executor shutdown has been called" not in out and "Traceback" not in out

    # the next start, with the database back: the trigger is retaken from the ring
    _with_database(node, working)
    monkeypatch.delenv("FLIGHTREC_SPOOL_FAILS")
    proc, base = node.start()
    try:
        rows = wait_for("the retaken snapshot", lambda: query(node.db, "SELECT trigger_kind, summary FROM snapshots"), 60, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, node.output()
    assert [r[0] for r in rows] == ["manual"]
    summary = rows[0][1] if isinstance(rows[0][1], dict) else json.loads(rows[0][1])
    assert summary["retaken"]["accepted_at"] and summary["step_count"] == 300


@pytest.mark.slow
def test_a_snapshot_whose_spool_write_failed_is_spooled_at_stop_when_the_disk_takes_it(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    working = node.db
    _with_database(node, DOWN)
    node.config.write_text(node.config.read_text().replace("snapshot_settle_s: 0.5", "snapshot_settle_s: 30"))
    # the snapshot's write and its amendment's (queued by the stop) fail; the disk has room again after
    monkeypatch.setenv("FLIGHTREC_SPOOL_FAILS", "2")
    proc, base = node.start(wrapper=True)
    try:
        assert _manual(base).status_code == 202
        assert not spool.pending(node.spool)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    out = node.output()
    assert proc.returncode == 0, out
    assert "spooled at stop" in out and "SNAPSHOT LOST" not in out
    assert len(spool.pending(node.spool)) == 1 and len(intent.pending(node.spool)) == 1

    _with_database(node, working)  # the next start commits it, once, and clears its intent
    monkeypatch.delenv("FLIGHTREC_SPOOL_FAILS")
    proc, base = node.start()
    try:
        wait_for("the spooled snapshot", lambda: not spool.pending(node.spool) and not intent.pending(node.spool), 60, proc)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, node.output()
    assert [r[0] for r in query(node.db, "SELECT trigger_kind FROM snapshots")] == ["manual"]
    assert "retaking" not in node.output()  # committed from its spool file, not taken again


@pytest.mark.slow
def test_an_amendment_not_due_at_stop_is_committed_before_the_exit(node: Node) -> None:
    cfg = node.config.read_text().replace("snapshot_settle_s: 0.5", "snapshot_settle_s: 30")
    node.config.write_text(cfg)
    proc, base = node.start()
    try:
        assert wait_for(
            "the ring read",
            lambda: len(httpx.get(base + "/api/v1/engines", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}).json()["items"]),
            30,
        )
        with open(node.kmsg, "a") as f:
            f.write(XID_LINE.format(seq=7, us=1) + "\n")
        wait_for("the first commit", lambda: query(node.db, "SELECT id FROM snapshots"), 30, proc)
        node.write_steps(5, time.time())  # late evidence the amendment takes
    finally:
        proc.send_signal(signal.SIGTERM)  # 30 s before the amendment is due
        proc.wait(timeout=60)
    out = node.output()
    assert proc.returncode == 0, out
    assert "Executor shutdown has been called" not in out and "Traceback" not in out
    [(summary, last_step)] = query(node.db, "SELECT summary, last_step FROM snapshots")
    summary = summary if isinstance(summary, dict) else json.loads(summary)
    assert summary.get("amended_at") and last_step == 305
