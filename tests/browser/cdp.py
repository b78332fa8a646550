"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only).

Chromium reads commands on fd 3 and writes replies and events on fd 4, each message one JSON
object ended by a NUL byte: no websocket library, no driver binary, no port to pick.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


class CdpError(Exception):
    pass


def find_chromium() -> str | None:
    env = os.environ.get("FLIGHTREC_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for c in CHROMIUM_CANDIDATES:
        if Path(c).exists():
            return c
    return shutil.which("chromium")


class Browser:
    def __init__(self, executable: str, *, width: int = 1400, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="flightrec-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._evt_r, evt_w = os.pipe()
        args = [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-extensions",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-dev-shm-usage",
            "--mute-audio",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--user-data-dir={self.profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # fd 3 and 4 of the child are the pipes' ends, whatever numbers they have here (bash: dash
        # cannot redirect from descriptors above 9)
        shell = f'exec "$@" 3<&{cmd_r} 4>&{evt_w}'
        self.log_path = Path(self.profile) / "chromium.log"
        log = open(self.log_path, "wb")  # noqa: SIM115  (the child keeps it)
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", shell, "bash", *args],
            pass_fds=(cmd_r, evt_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        os.close(cmd_r)
        os.close(evt_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    # -- protocol -------------------------------------------------------------------------------
    def _read_message(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._evt_r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._evt_r, 1 << 20)
            if not chunk:
                raise CdpError(f"chromium closed the DevTools pipe: {self.log_tail()}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)  # type: ignore[no-any-return]

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError as exc:
            raise CdpError(f"chromium is gone (rc {self.proc.poll()}): {self.log_tail()}") from exc
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(max(0.0, deadline - time.monotonic()))
            if reply is None:
                raise CdpError(f"{method}: no reply within {timeout} s")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]
            if "method" in reply:
                self.events.append(reply)

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self._read_message(max(0.0, deadline - time.monotonic()))
            if msg is not None and "method" in msg:
                self.events.append(msg)

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise CdpError(f"timed out waiting for {what}")
            self.pump(0.1)

    # -- pages ----------------------------------------------------------------------------------
    def new_page(self) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._evt_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session, timeout=timeout)

    def _mine(self) -> list[dict[str, Any]]:
        return [e for e in self.browser.events if e.get("sessionId") == self.session]

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        seen = len(self._mine())
        self.send("Page.navigate", {"url": url})
        self.browser.wait_for(lambda: any(e["method"] == "Page.loadEventFired" for e in self._mine()[seen:]), timeout, f"load of {url}")

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in res:
            raise CdpError(f"evaluate failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_js(self, expression: str, timeout: float = 30.0) -> None:
        self.browser.wait_for(lambda: bool(self.evaluate(expression)), timeout, expression)

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser-logged errors (failed loads, CSP)."""
        out = []
        for e in self._mine():
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                entry = p["entry"]
                out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
        return out

    def screenshot(self, *, clip: dict[str, float] | None = None, full_page: bool = False) -> bytes:
        import base64

        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = clip
            params["captureBeyondViewport"] = True  # else what lies below the viewport is blank
        if full_page:
            params["captureBeyondViewport"] = True
            metrics = self.send("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        return base64.b64decode(self.send("Page.captureScreenshot", params, timeout=60)["data"])
