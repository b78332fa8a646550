"""``flightrec report`` of the demo's crash snapshot reads as a complete upstream bug report, and
its bundle replays: the recipe it gives works on the archive it writes."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from collector.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_snapshot_as_a_bug_report(demo_run: Any, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "report.md"
    bundle = tmp_path / "b.tar.gz"
    assert main(["report", "1", "--db", demo_run.db, "-o", str(out), "--bundle", str(bundle)]) == 0
    text = out.read_text()
    # vLLM's template, in its order
    heads = [
        "# [Bug]: ",
        "### Your current environment",
        "### 🐛 Describe the bug",
        "#### Engine arguments",
        "#### KV connector configuration",
        "#### The fault",
        "#### The last steps before the fault",
        "#### How to reproduce",
        "### Before submitting a new issue...",
    ]
    at = [text.index(h) for h in heads]
    assert at == sorted(at)
    assert "Xid 43 (GPU stopped processing) with torch.AcceleratorError: CUDA error: unspecified launch failure" in text.splitlines()[0]
    # the environment, the exact arguments and the connectors, from the fingerprint
    assert "vLLM version            : 0.11.1" in text and "NCCL_NET_PLUGIN=none" in text and "Parallelism             : TP 2" in text
    assert "| `max_num_seqs` | `16` |" in text and "| `block_size` | `64` |" in text and "| `cuda_graph_mode` | `FULL` |" in text
    assert '"kv_connector": "HiSparseConnector"' in text and "Peer `prefill-0`, prefill (kv_producer)" in text
    # the fault: the Xid with its catalog meaning, both workers' tracebacks, the failed step
    assert "**Xid 43: GPU stopped processing** (warning, application)" in text and "Action: restart the application" in text
    assert "Traceback of Worker_TP0" in text and "Traceback of Worker_TP1" in text and "copy_event.synchronize()" in text
    assert text.index("Traceback of Worker_TP0") < text.index("Traceback of EngineCore_DP0")
    assert "| Worker_TP1 | 3408 | 26096 |" in text or re.search(r"\| Worker_TP1 \| \d+ \| \d+ \|", text)
    # the last steps summarised and the recipe: the ramp's phases
    assert (
        "| step duration (ms) |" in text and "| scheduled decode tokens |" in text and "Context length (computed tokens) of the 15 requests" in text
    )
    assert re.search(r"^\s+5\s+C16\s+25 .*<- fault$", text, re.M)
    # nothing identifying: request ids hashed, host names masked
    assert not re.search(r"cmpl-[0-9a-f]{8}", text)
    assert "Host                    : host-1" in text

    data = bundle.read_bytes()
    assert len(data) <= 10 * 1000 * 1000 and (bundle.stat().st_mode & 0o077) == 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    folder = tmp_path / "x" / "flightrec-report-1"
    assert (folder / "report.md").read_text() == text
    snap = (folder / "snapshot.json").read_text()
    assert not re.search(r"cmpl-[0-9a-f]{8}", snap) and snap.count('"req-') > 1000  # every request row's id, hashed
    # the recipe works on the bundle: flightrec replay --plan --from-file snapshot.json
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")} | {"PYTHONPATH": str(ROOT)}
    plan = subprocess.run(
        [sys.executable, "-m", "collector.cli", "replay", "--plan", "--from-file", "snapshot.json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr
    assert "63 requests" in plan.stdout and "C16" in plan.stdout


def test_report_without_an_id_or_file_is_a_usage_error(capsys: Any) -> None:
    assert main(["report"]) == 2
    assert "needs a snapshot ID" in capsys.readouterr().err


def test_a_report_from_an_export_file_keeps_hostnames_on_request(demo_run: Any, tmp_path: Path, capsys: Any) -> None:
    export = tmp_path / "s.json.gz"
    assert main(["snapshots", "export", "1", "--db", demo_run.db, "-o", str(export)]) == 0
    capsys.readouterr()
    assert main(["report", "--from-file", str(export), "--keep-hostnames"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# [Bug]: Xid 43") and "#### How to reproduce" in text
    assert "host-1" not in text  # kept as they are
    assert main(["report", "--from-file", str(tmp_path / "missing.json.gz")]) == 2
    assert "cannot read" in capsys.readouterr().err
