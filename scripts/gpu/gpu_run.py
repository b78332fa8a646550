"""A GPU run's clock and its last resort: each phase's result so far, written as JSON, and a
watchdog that ends the run by its end-by whatever happens."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gpu_tier_lib import log
from vllm_gpu_tier import Checks

SHUTDOWN_S = 25.0  # the end of a run: stopping servers and the sidecar, the JSON, the logs

_NUMBER_LIST = re.compile(r"\[\n\s+((?:-?[0-9.eE+-]+|null|true|false)(?:,\n\s+(?:-?[0-9.eE+-]+|null|true|false))*)\n\s*\]")


def dumps(body: Any) -> str:
    """JSON indented for reading, with lists of plain numbers on one line (each request's own
    figures would otherwise take a line a number)."""
    text = json.dumps(body, indent=1, default=str)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


class Run:
    """What the watchdog writes if the run must end at ``end_by``: each phase's result so far,
    and the processes to stop."""

    def __init__(self, out: Path, end_by: float) -> None:
        self.out, self.end_by = out, end_by
        self.results: dict[str, dict[str, Any]] = {}
        self.checks: dict[str, Checks] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.end_by - time.time()

    def save(self, phase: str) -> None:
        with self.lock:
            checks = self.checks.get(phase) or Checks()
            body = {**self.results.get(phase, {}), "checks": checks.items, "failed": checks.failed}
            tmp = self.out / f".gpu-tier-{phase}.json.tmp"
            tmp.write_text(dumps(body))
            tmp.replace(self.out / f"gpu-tier-{phase}.json")

    def copy_logs(self, limit: int = 3_000_000) -> None:
        for path in self.logs:
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, path.stat().st_size - limit))
                    (self.out / path.name).write_bytes(f.read())
            except OSError:
                pass

    def watchdog(self) -> None:
        def run() -> None:
            while self.left() > 3.0:
                time.sleep(0.5)
            log("end-by reached: writing what there is, stopping every process of this run")
            for phase, res in list(self.results.items()):
                res["cut_at_end_by"] = True
                try:
                    self.save(phase)
                except Exception:  # noqa: BLE001 - last resort: keep going
                    pass
            for p in self.procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.copy_logs()
            os._exit(3)

        threading.Thread(target=run, daemon=True, name="end-by").start()
