"""A real ``flightrec serve`` for the end-to-end tests: its config, a port, SQLite in ``workdir``
(``fr.db``), its output in ``workdir/sidecar.log``, in a session of its own (stopped by group)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def serve(config: Path, port: int, workdir: Path, *, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "collector.cli", "serve", "--config", str(config), "--port", str(port)]
    return subprocess.Popen(
        [*cmd, "--db", f"sqlite:///{workdir / 'fr.db'}"],
        stdout=open(workdir / "sidecar.log", "wb"),  # noqa: SIM115 - the child's for its life
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        start_new_session=True,
        cwd=workdir,
    )
