"""Postgres stopped, then hung (SIGSTOP), under a real load, with a fault in each outage: the
CI size of ``scripts/outage.py`` (RELIABILITY.md records its 60 s run). A throwaway cluster of
its own (initdb, pg_ctl on a free port): the shared server is never stopped.

Asserted from the script's figures: no step lost or stored twice; /healthz said the database
was down within 10 s (the hang: once a statement waits past the server's own timeout) and
never said up again during the outage; every API answer within 15 s; each fault's snapshot
committed after the return, its last step at the fault, not at the return; the backlog drained."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import outage  # noqa: E402


@pytest.mark.slow
def test_postgres_stopped_and_hung_under_load_loses_nothing(tmp_path: Path) -> None:
    if outage.pg_bin("initdb") is None or outage.pg_bin("pg_ctl") is None:
        pytest.skip("initdb/pg_ctl not installed (scripts/install-test-deps.sh installs postgresql)")
    out = tmp_path / "figures.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "outage.py"),
            "--outage",
            "8",
            "--recover",
            "6",
            "--warmup",
            "3",
            "--engines",
            "2",
            "--running",
            "8",
            "--steps-per-second",
            "50",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    fig = json.loads(out.read_text())
    assert fig["steps_sent"] > 2 * 50 * 20 and fig["steps_lost"] == 0 and fig["duplicate_step_rows"] == 0
    assert fig["steps_stored"] == fig["steps_sent"] and fig["sidecar_exit"] == 0
    stop, hang = fig["outages"]
    assert (stop["kind"], hang["kind"]) == ("stop", "hang")
    # a statement in flight waits past the server's timeout, or a new connection times out: both say so
    assert "is hung" in hang["healthz_error"] or "timeout" in hang["healthz_error"]
    for o in (stop, hang):
        assert o["healthz_said_down_after_s"] <= 10 and o["healthz_ok_during"] == 0
        assert o["step_at_fault"] <= o["snapshot_last_step"] <= o["step_at_fault"] + 150 < o["step_at_return"]
        assert o["snapshot_committed_after_return_s"] is not None and o["drained_after_return_s"] is not None
        assert all(r["max_s"] <= 15 and "None" not in r["codes"] for r in o["api"].values())
