from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest

from collector.cli import main
from collector.snapshot.document import SnapshotDoc
from collector.storage.connect import make_engine
from collector.storage.repo import Repository

FIXTURE_LOG = Path(__file__).parents[1] / "fixtures" / "vllm-logs" / "crash.log"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("FLIGHTREC_"):
            monkeypatch.delenv(key)


def store_one(url: str) -> int:
    ts = time.time()
    doc = SnapshotDoc(
        host="node-a",
        engine="decode-0",
        created_at=ts,
        fault_ts=ts,
        trigger={"kind": "cuda_error", "source": "log", "message": "CUDA error: unspecified launch failure"},
        steps=[{"step": i, "ts": ts} for i in range(3)],
        requests=[{"step": 2, "request_id": "r1", "prompt_len": 32000}],
    )
    return Repository(make_engine(url), host="node-a").store_snapshot(doc, incident_window_s=30, incident_key="k")[0]


def test_db_upgrade_downgrade_and_current(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'f.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    assert re.search(r"revision \d{4}$", capsys.readouterr().out.strip())  # the head, whichever it is
    assert main(["db", "downgrade", "base", "--db", db]) == 0
    assert "revision base" in capsys.readouterr().out


def test_snapshots_list_show_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'f.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    sid = store_one(db)
    capsys.readouterr()
    assert main(["snapshots", "list", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "decode-0" in out and "cuda_error" in out and "unspecified launch failure" in out
    assert main(["snapshots", "show", str(sid), "--db", db]) == 0
    brief = capsys.readouterr().out
    assert f"snapshot {sid} of decode-0" in brief and "counts      steps 3, requests 1" in brief and len(brief) < 4000
    assert main(["snapshots", "show", str(sid), "--json", "--db", db]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["counts"]["steps"] == 3 and shown["counts"]["requests"] == 1
    target = tmp_path / "snap.json.gz"
    assert main(["snapshots", "export", str(sid), "--db", db, "-o", str(target)]) == 0
    data = json.loads(gzip.decompress(target.read_bytes()))
    assert data["schema"] == "flightrec.snapshot/v1" and data["id"] == sid


def test_a_missing_snapshot_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'f.db'}"
    main(["db", "upgrade", "--db", db])
    assert main(["snapshots", "show", "999", "--db", db]) == 1
    err = capsys.readouterr().err
    assert "999" in err and "Traceback" not in err


def test_a_database_that_is_down_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "list", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"]) == 1
    assert "flightrec:" in capsys.readouterr().err


@pytest.mark.skipif(not FIXTURE_LOG.exists(), reason="no captured crash log")
def test_inspect_log_is_wired(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-log", str(FIXTURE_LOG), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(e["kind"] == "cuda_error" for e in report["events"])
