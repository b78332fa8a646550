"""The CLI over a wedge's stored snapshot: ``snapshots show`` names each process's blocking
frame, ``snapshots export`` and ``report`` carry the stacks."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

from collector.cli import main
from collector.model import EventKind
from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from test_snapshots_api import make_doc  # noqa: E402

from tests.stacks.sample import stacks_part  # noqa: E402


def _stored(tmp_path: Path) -> tuple[str, int]:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    upgrade(url)
    repo = Repository(make_engine(url), host="node-a")
    doc = make_doc(kind=EventKind.ENGINE_WEDGED)
    doc.stacks = stacks_part()
    doc.summary["stacks"] = {
        "status": "partial",
        "reason": None,
        "processes": [{"role": "engine_core", "pid": 9682, "state": "stuck", "blocking": "wait_for_the_engine_lock (blocked_child.py:19)"}],
    }
    sid, _ = repo.store_snapshot(doc, incident_window_s=30, incident_key="k")
    return url, sid


def test_show_export_and_report_carry_the_stacks(tmp_path: Path, capsys: Any) -> None:
    url, sid = _stored(tmp_path)
    assert main(["snapshots", "show", str(sid), "--db", url]) == 0
    shown = capsys.readouterr().out
    assert "  stacks      partial" in shown and "engine_core  pid 9682: stuck, blocked at wait_for_the_engine_lock" in shown
    assert main(["snapshots", "show", str(sid), "--db", url, "--json"]) == 0
    assert "stacks" not in json.loads(capsys.readouterr().out)  # the summary only; the export has them whole
    out = tmp_path / "e.json.gz"
    assert main(["snapshots", "export", str(sid), "--db", url, "-o", str(out)]) == 0
    export = json.loads(gzip.decompress(out.read_bytes()))
    assert export["stacks"]["processes"][0]["blocking"]["frame"]["function"] == "wait_for_the_engine_lock"
    report = tmp_path / "r.md"
    assert main(["report", str(sid), "--db", url, "-o", str(report)]) == 0
    assert "#### The engine's stacks while it was wedged" in report.read_text()
