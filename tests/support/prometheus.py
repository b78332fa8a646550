"""A throwaway Prometheus on loopback: scrapes what a test names, evaluates the shipped rules,
sends to a test's Alertmanager, and answers PromQL queries.

For tests (not shipped in the package). Debian's ``prometheus`` 2.42 (the package that also
brings promtool). Targets come from a file_sd file the test rewrites as its ports become
known (Prometheus rereads it within its refresh interval); storage is a temporary folder.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from collector.errors import FlightrecError
from tests.support.alertmanager import free_port


class LocalPrometheusError(FlightrecError):
    """The binary is missing, refused its config, or did not become ready."""


def find_binary() -> str | None:
    return shutil.which("prometheus")


class LocalPrometheus:
    def __init__(
        self,
        *,
        rules: str | None = None,
        alertmanager: str | None = None,
        interval: str = "1s",
        binary: str | None = None,
    ) -> None:
        """``rules``: the text of a rules file to evaluate; ``alertmanager``: its URL
        (``http://127.0.0.1:PORT``). Scrape and evaluation every ``interval``."""
        self.binary = binary or find_binary()
        if self.binary is None:
            raise LocalPrometheusError("no prometheus binary on PATH (Debian: apt-get install prometheus)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="flightrec-prom-")
        root = Path(self._dir.name)
        self._targets = root / "targets.yml"
        self._targets.write_text("[]\n")
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {"job_name": "test", "file_sd_configs": [{"files": [str(self._targets)], "refresh_interval": "1s"}]},
            ],
        }
        if rules is not None:
            (root / "rules.yml").write_text(rules)
            config["rule_files"] = [str(root / "rules.yml")]
        if alertmanager is not None:
            host = alertmanager.split("://", 1)[-1].rstrip("/")
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [host]}]}]}
        self._config = root / "prometheus.yml"
        self._config.write_text(yaml.safe_dump(config, sort_keys=False))
        self._log = root / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def set_targets(self, groups: list[dict[str, Any]]) -> None:
        """file_sd groups: ``[{"targets": ["127.0.0.1:8000"], "labels": {"job": "vllm", ...}}]``
        (a group's ``job`` label overrides the job name). Written whole, then renamed in, so
        Prometheus never reads half a file."""
        tmp = self._targets.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(groups, sort_keys=False))
        tmp.replace(self._targets)

    def start(self, timeout: float = 30.0) -> LocalPrometheus:
        data = Path(self._dir.name) / "data"
        data.mkdir(exist_ok=True)
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(self.binary),
                    f"--config.file={self._config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    # alerts go out at each evaluation that changes them, and again every second
                    "--rules.alert.resend-delay=1s",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LocalPrometheusError(f"prometheus exited: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise LocalPrometheusError(f"prometheus not ready in {timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = httpx.get(self.url + path, params=params, timeout=10.0)
        body = response.json()
        if body.get("status") != "success":
            raise LocalPrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: the result vector (``[{"metric": {...}, "value": [ts, "v"]}]``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        result = data["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The rules' alerts now (pending and firing), from /api/v1/alerts."""
        return list(self._get("/api/v1/alerts")["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets")["activeTargets"])
