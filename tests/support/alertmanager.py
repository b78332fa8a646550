"""A throwaway Alertmanager on loopback, and a webhook receiver to watch what it notifies.

For tests and benchmarks (not shipped in the package): ``LocalAlertmanager`` writes a config whose only receiver is a
webhook, starts the binary with clustering off and its storage in a temporary folder, and stops
it again. The binary is found as ``alertmanager`` or Debian's ``prometheus-alertmanager``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from collector.errors import FlightrecError

BINARIES = ("prometheus-alertmanager", "alertmanager")


class LocalAlertmanagerError(FlightrecError):
    """The binary is missing or did not become ready."""


def find_binary() -> str | None:
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class WebhookReceiver:
    """Records the JSON bodies Alertmanager POSTs to it (one per notification)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def alerts(self, status: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            items = [a for n in self.notifications for a in n.get("alerts", [])]
        return [a for a in items if status is None or a.get("status") == status]


CONFIG = """\
route:
  receiver: hook
  group_by: ['...']
  group_wait: 0s
  group_interval: {group_interval}
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {webhook}
        send_resolved: true
"""


def with_webhook(config_text: str, webhook_url: str, *, group_wait: str = "0s", group_interval: str = "100ms") -> str:
    """A real Alertmanager config (the shipped one) with every receiver replaced by the webhook
    and its waits shortened: its routes, grouping and inhibit rules are what a test exercises."""
    import yaml

    cfg = yaml.safe_load(config_text)
    cfg["receivers"] = [{"name": r["name"], "webhook_configs": [{"url": webhook_url, "send_resolved": True}]} for r in cfg.get("receivers", [])]

    def shorten(route: dict[str, Any]) -> None:
        route["group_wait"] = group_wait
        route["group_interval"] = group_interval
        for child in route.get("routes", []):
            shorten(child)

    shorten(cfg["route"])
    return str(yaml.safe_dump(cfg, sort_keys=False))


class LocalAlertmanager:
    def __init__(
        self,
        webhook_url: str,
        *,
        port: int | None = None,
        binary: str | None = None,
        group_interval: str = "100ms",
        config_text: str | None = None,
    ) -> None:
        """``config_text``: a whole config to run instead of the one-webhook default (see
        ``with_webhook``)."""
        self.binary = binary or find_binary()
        if self.binary is None:
            raise LocalAlertmanagerError("no alertmanager binary on PATH (" + ", ".join(BINARIES) + ")")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="flightrec-am-")
        self._config = Path(self._dir.name) / "alertmanager.yml"
        self._config.write_text(config_text or CONFIG.format(webhook=webhook_url, group_interval=group_interval))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = Path(self._dir.name) / "alertmanager.log"

    def start(self, timeout: float = 15.0) -> LocalAlertmanager:
        storage = Path(self._dir.name) / "data"
        storage.mkdir(exist_ok=True)
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(self.binary),
                    f"--config.file={self._config}",
                    f"--storage.path={storage}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LocalAlertmanagerError(f"alertmanager exited: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise LocalAlertmanagerError(f"alertmanager not ready in {timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alerts(self, alertname: str | None = None) -> list[dict[str, Any]]:
        """Active alerts, from GET /api/v2/alerts."""
        params = {"filter": f'alertname="{alertname}"'} if alertname else None
        response = httpx.get(self.url + "/api/v2/alerts", params=params, timeout=2.0)
        response.raise_for_status()
        return list(response.json())
