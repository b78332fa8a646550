"""``flightrec demo --hang`` end to end, as a user runs it: the simulated decode engine wedges at
the fault point (its step never ends, 15 requests held, /health 200, /metrics frozen), the sidecar
judges it wedged at its default floor, commits the wedge's snapshot, and sees it move again;
then the stored record says so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from collector.storage.connect import make_engine
from collector.storage.cursor import SnapshotFilter
from collector.storage.repo import Repository


def test_demo_hang_shows_a_wedge_its_snapshot_and_its_end(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "demo",
            "--hang",
            "--hang-for",
            "15",
            "--exit-after-snapshot",
            "--port",
            "0",
            "--db",
            db,
            "--workdir",
            str(tmp_path / "wd"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "the decode engine wedged after step" in out and "/health 200" in out
    assert re.search(r"decode-0 is wedged: \d+ requests held and no step for 1\d\.\d s", out), out
    assert re.search(r"wedge snapshot \d+ of decode-0 \(trigger engine_wedged", out), out
    # the wedge's end as the sidecar's verdict: stepping again, or already done with what it held
    # (a loaded core can look only after the last of them finished)
    assert "the decode engine moved again after" in out and re.search(r"decode-0 is wedged: .*\n(?:.*\n)*?\s*decode-0 is (ok|idle)", out), out
    assert "died" not in out  # a wedge, not the crash
    repo = Repository(make_engine(db), host="x")
    snaps, _ = repo.list_snapshots(SnapshotFilter(), limit=10)
    wedges = [s for s in snaps if s.get("trigger_kind") == "engine_wedged"]
    assert len(wedges) == 1 and wedges[0]["engine"] == "decode-0", snaps
    doc = repo.get_snapshot(int(wedges[0]["id"]))
    assert doc.steps and all(s["running"] for s in doc.steps[-5:])  # requests held at its last steps
    assert doc.stacks is not None  # the stacks part is there, saying why a simulated engine has none
    # the wedge's end, noted in its snapshot: stuck from its last step, or from the first request
    # it held after that step where one came later (ms after it, when prefill handed one over)
    assert 14.5 <= doc.summary["resumed"]["stuck_s"] <= 17.0
    kinds = [e["kind"] for e in repo.list_events(engine="decode-0", limit=500)]
    assert kinds.count("engine_wedged") == 1 and "engine_resumed" in kinds
    assert "engine_dead" not in kinds and "cuda_error" not in kinds
