"""A real vLLM (CPU build) that can be wedged on demand, watched by ``flightrec serve`` paging a
real Alertmanager: what the wedge test and the wedge benchmark share (test support, not shipped).

One server for every case, as vLLM's start-up is most of the time: the engine core runs
``wedge_scheduler.WedgeScheduler`` (the recorder's scheduler, blocking inside its step while a
file exists), its steps take at least ``STEP_MIN_MS`` (the fault plugin's pacing, no fault: a
batch of long requests stays running for a minute, as a GPU's would), and its processes can be
stopped (SIGSTOP) and continued. ``load()`` puts a batch running with none waiting, read from the
engine core's own ring; the wedges are timed from that ring's last step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.channel.blocks import RequestRecords
from collector.channel.codec import TAG_REQS, decode
from collector.channel.naming import parse_ring_file_name
from collector.channel.ringfile import RingReader
from collector.model import StepRecord

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from alertmanager import LocalAlertmanager, WebhookReceiver  # noqa: E402
from alertmanager import free_port as any_port  # noqa: E402
from vllm_server import engine_core_pid, start_server, stop_group, wait_healthy, write_tiny_model  # noqa: E402

STEP_MIN_MS = 20  # a decode step's floor: 1900 tokens take over 38 s of stepping
MAX_TOKENS = 1900  # with a prompt of about 100 tokens, inside --max-model-len 2048
ALERT = "VllmEngineWedged"


def get(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """Status and JSON body (an error status's body too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body or b"null")
        except ValueError:
            return exc.code, body.decode(errors="replace")


def get_json(url: str, timeout: float = 10.0) -> Any:
    status, body = get(url, timeout)
    if status != 200:
        raise RuntimeError(f"GET {url}: {status} {body}")
    return body


def wait_for(what: str, probe: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """``probe()``'s first truthy answer; an error names ``what`` and the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (urllib.error.URLError, OSError, RuntimeError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout} s (last: {last!r})"[:3000])


class CoreRing:
    """The engine core's own steps, read from its scheduler ring as they are written."""

    def __init__(self, recorder_dir: Path) -> None:
        self.recorder_dir = recorder_dir
        self.reader: RingReader | None = None
        self.requests = RequestRecords()  # (its R records are read in order)
        self.last: StepRecord | None = None

    def poll(self) -> StepRecord | None:
        if self.reader is None:
            for path in self.recorder_dir.glob("*.sched.*.ring"):
                if parse_ring_file_name(path.name) is not None:
                    self.reader = RingReader(path)
        if self.reader is not None:
            for payload in self.reader.read():
                if payload[:1] == TAG_REQS:
                    step = decode(payload, engine="core", requests=self.requests)[1]
                    if isinstance(step, StepRecord):
                        self.last = step
        return self.last


@dataclass
class Wedge:
    """One wedge as the outside saw it: wall-clock times (time.time())."""

    kind: str  # "step" (blocked inside schedule()), "worker" (one TP rank blocked) or "sigstop"
    started: float  # the file made, or SIGSTOP sent
    last_step: StepRecord
    event: dict[str, Any] | None = None
    event_seen: float | None = None
    snapshot: dict[str, Any] | None = None  # its summary, as listed
    snapshot_seen: float | None = None
    page: dict[str, Any] | None = None  # the alert the receiver got
    page_seen: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class WedgeRig:
    def __init__(
        self,
        workdir: Path,
        python: str,
        *,
        engine: str = "wedge-0",
        startup_s: float = 900.0,
        extra_args: list[str] | None = None,
        wedge_rank: int = 1,
    ) -> None:
        self.workdir = workdir
        self.python = python
        self.engine = engine
        self.startup_s = startup_s
        self.extra_args = extra_args or []
        self.recorder_dir = workdir / "recorder"
        self.model = write_tiny_model(workdir / "model")
        self.wedge_file = workdir / "wedge"
        self.worker_wedge_file = workdir / "wedge-worker"  # the fault plugin's: one TP rank blocks
        self.wedge_rank = wedge_rank
        self.vllm_log = workdir / "vllm.log"
        self.sidecar_log = workdir / "sidecar.log"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.hook = WebhookReceiver()
        self.hook_times: list[float] = []  # when each notification arrived
        self.am: LocalAlertmanager | None = None
        self.ring = CoreRing(self.recorder_dir)
        self.errors: list[str] = []
        self.sent = 0
        self.vllm = ""
        self.side = ""
        self.server: subprocess.Popen[bytes] | None = None

    # -- life -----------------------------------------------------------------------------

    def start(self) -> WedgeRig:
        self.hook.start()
        self.am = LocalAlertmanager(self.hook.url).start()
        vport, sport = any_port(), any_port()
        self.vllm, self.side = f"http://127.0.0.1:{vport}", f"http://127.0.0.1:{sport}"
        env = {
            "FLIGHTREC_RECORDER_DIR": str(self.recorder_dir),
            "FLIGHTREC_WEDGE_FILE": str(self.wedge_file),
            "FLIGHTREC_FAULT_AFTER_STEPS": str(10**12),  # the plugin's pacing only: it never faults
            "FLIGHTREC_FAULT_STEP_MIN_MS": str(STEP_MIN_MS),
            "FLIGHTREC_WEDGE_WORKER_FILE": str(self.worker_wedge_file),
            "FLIGHTREC_WEDGE_RANK": str(self.wedge_rank),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        self.server = start_server(
            self.python,
            self.model,
            vport,
            self.vllm_log,
            env=env,
            extra_args=["--scheduler-cls", "wedge_scheduler.WedgeScheduler", *self.extra_args],
        )
        self.procs.append(self.server)
        config = self.workdir / "flightrec.yaml"
        config.write_text(
            f"engines:\n  - name: {self.engine}\n    url: {self.vllm}\n    log: {self.vllm_log}\n"
            f"alertmanager: ['{self.am.url}']\nscrape_interval: 1.0\nnvml: 'off'\nkmsg: 'off'\n"
        )
        sidecar = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "serve",
                "--config",
                str(config),
                "--port",
                str(sport),
                "--db",
                f"sqlite:///{self.workdir / 'fr.db'}",
            ],
            stdout=open(self.sidecar_log, "wb"),  # noqa: SIM115 - the child's for its life
            stderr=subprocess.STDOUT,
            env={**os.environ, "FLIGHTREC_RECORDER_DIR": str(self.recorder_dir)},
            start_new_session=True,
            cwd=self.workdir,
        )
        self.procs.append(sidecar)
        wait_healthy(self.vllm, self.server, self.startup_s)
        wait_for("the sidecar's /healthz", lambda: get(f"{self.side}/healthz")[0] == 200, 60)
        wait_for(
            "the engine known to the sidecar",
            lambda: any(e["name"] == self.engine for e in get_json(f"{self.side}/api/v1/engines")["items"]),
            60,
        )
        threading.Thread(target=self._watch_hook, daemon=True).start()
        return self

    def stop(self) -> None:
        self.wedge_file.unlink(missing_ok=True)
        self.worker_wedge_file.unlink(missing_ok=True)
        core = self.core_pid()
        if core is not None:
            try:
                os.kill(core, signal.SIGCONT)  # a stopped core cannot die of SIGTERM
            except OSError:
                pass
        for proc in reversed(self.procs):
            stop_group(proc)
        if self.am is not None:
            self.am.close()
        self.hook.stop()

    def __enter__(self) -> WedgeRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tails(self) -> str:
        def tail(p: Path) -> str:
            try:
                return p.read_text(errors="replace")[-3000:]
            except OSError:
                return ""

        return f"--- sidecar\n{tail(self.sidecar_log)}\n--- vllm\n{tail(self.vllm_log)}"

    def _watch_hook(self) -> None:
        seen = 0
        while True:
            n = len(self.hook.notifications)
            if n > seen:
                self.hook_times.extend([time.time()] * (n - seen))
                seen = n
            time.sleep(0.02)

    # -- the engine -------------------------------------------------------------------------

    def core_pid(self) -> int | None:
        return None if self.server is None else engine_core_pid(self.server.pid)

    def _send(self, i: int, max_tokens: int) -> None:
        prompt = [(7 * k + i) % 1000 + 3 for k in range(100)]
        body = json.dumps({"model": str(self.model), "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
        req = urllib.request.Request(
            f"{self.vllm}/v1/completions", body.encode(), {"Content-Type": "application/json", "X-Request-Id": f"wedge{i:03d}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=900) as resp:
                resp.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.errors.append(repr(exc))

    def send(self, n: int, max_tokens: int = MAX_TOKENS) -> list[threading.Thread]:
        threads = []
        for _ in range(n):
            threads.append(threading.Thread(target=self._send, args=(self.sent, max_tokens), daemon=True))
            threads[-1].start()
            self.sent += 1
        return threads

    def load(self, n: int = 8, timeout: float = 120.0) -> StepRecord:
        """``n`` long requests running, none waiting (sent unless the engine already runs ``n``:
        a batch outlives several wedges); returns the engine core's step once 20 more steps
        have run and vLLM's /metrics, as the sidecar scraped it, says so too."""
        last = self.ring.poll()
        if last is None or last.running < n:
            self.send(n)

        def busy() -> StepRecord | None:
            last = self.ring.poll()
            return last if last is not None and last.running >= n and not last.waiting else None

        full: StepRecord = wait_for(f"{n} requests running", busy, timeout, every=0.02)
        # some steady decode before a wedge: the engine's pace is known, as in production
        wait_for("20 decode steps", lambda: (s := busy()) is not None and s.step >= full.step + 20 and s, 60, every=0.02)

        def sidecar_sees() -> bool:  # the sched ring has no queue length: vLLM's /metrics says none waits
            values = (self.engine_item().get("last_scrape") or {}).get("values") or {}
            return values.get("num_requests_running") == n and values.get("num_requests_waiting") == 0

        wait_for(f"the sidecar seeing {n} running, none waiting", sidecar_sees, 30)
        last = self.ring.poll()
        assert last is not None and last.running >= n
        return last

    def idle(self, timeout: float = 600.0) -> None:
        """Until the engine has no request (the last batch done)."""

        def done() -> bool:
            last = self.ring.poll()
            return last is not None and not last.running and not last.waiting

        wait_for("the engine idle", done, timeout, every=0.5)

    def wedge(self, kind: str) -> Wedge:
        """Wedge the loaded engine: "step" blocks it inside schedule(), "worker" blocks one TP
        rank's execute_model (``wedge_rank``), "sigstop" stops its core. The last step is the
        ring's once it has stopped moving."""
        if kind == "step":
            self.wedge_file.touch()
        elif kind == "worker":
            self.worker_wedge_file.touch()
        else:
            core = self.core_pid()
            assert core is not None, "no engine core"
            os.kill(core, signal.SIGSTOP)
        started = time.time()
        # the last step: the ring's once it has not moved for 2 s (a step in flight, scheduled
        # before the wedge, may be written late on a loaded machine; the floor is 10 s)
        last, since = self.ring.poll(), time.monotonic()
        while time.monotonic() - since < 2.0:
            time.sleep(0.05)
            now = self.ring.poll()
            if now is not None and (last is None or now.step != last.step):
                last, since = now, time.monotonic()
        assert last is not None
        return Wedge(kind=kind, started=started, last_step=last)

    def release(self, wedge: Wedge) -> float:
        if wedge.kind == "step":
            self.wedge_file.unlink()
        elif wedge.kind == "worker":
            self.worker_wedge_file.unlink()
        else:
            core = self.core_pid()
            assert core is not None
            os.kill(core, signal.SIGCONT)
        return time.time()

    # -- the sidecar --------------------------------------------------------------------------

    def events(self, kind: str) -> list[dict[str, Any]]:
        return list(get_json(f"{self.side}/api/v1/events?kind={kind}&engine={self.engine}")["items"])

    def engine_item(self) -> dict[str, Any]:
        (item,) = [e for e in get_json(f"{self.side}/api/v1/engines")["items"] if e["name"] == self.engine]
        return dict(item)

    def get_snapshot(self, snapshot_id: int) -> dict[str, Any]:
        doc: dict[str, Any] = get_json(f"{self.side}/api/v1/snapshots/{snapshot_id}", timeout=30)
        return doc

    def health(self) -> tuple[int, Any]:
        return get(f"{self.side}/api/v1/engines/{self.engine}/health")

    def metric(self, name: str) -> float | None:
        with urllib.request.urlopen(f"{self.side}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") and f'engine="{self.engine}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return None

    def pages(self, status: str | None = None) -> list[dict[str, Any]]:
        return [a for a in self.hook.alerts(status) if a.get("labels", {}).get("alertname") == ALERT and a["labels"].get("engine") == self.engine]

    def follow(self, wedge: Wedge, timeout: float = 120.0) -> Wedge:
        """Wait for the wedge's event, its committed snapshot and its page, noting when each was
        first seen (polled every 0.1 s)."""
        before_events = {e["id"] for e in self.events("engine_wedged")}
        before_snaps = {s["id"] for s in get_json(f"{self.side}/api/v1/snapshots?engine={self.engine}")["items"]}
        before_pages = len(self.pages("firing"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (wedge.event is None or wedge.snapshot is None or wedge.page is None):
            now = time.time()
            if wedge.event is None:
                new = [e for e in self.events("engine_wedged") if e["id"] not in before_events]
                if new:
                    wedge.event, wedge.event_seen = new[-1], now
            if wedge.snapshot is None:
                items = get_json(f"{self.side}/api/v1/snapshots?engine={self.engine}")["items"]
                new = [s for s in items if s["id"] not in before_snaps and s["trigger_kind"] == "engine_wedged"]
                if new:
                    wedge.snapshot, wedge.snapshot_seen = new[-1], now
            if wedge.page is None:
                firing = self.pages("firing")
                if len(firing) > before_pages:
                    wedge.page = firing[-1]
                    wedge.page_seen = self.hook_times[-1] if self.hook_times else now
            time.sleep(0.1)
        return wedge

    def stacks(self, snapshot_id: int, timeout: float = 60.0) -> dict[str, Any]:
        """The snapshot's stacks once read (the amendment carries them)."""

        def read() -> dict[str, Any] | None:
            status, body = get(f"{self.side}/api/v1/snapshots/{snapshot_id}/stacks", timeout=30)
            return body if status == 200 and isinstance(body, dict) and body.get("status") not in (None, "reading") else None

        doc: dict[str, Any] = wait_for(f"snapshot {snapshot_id}'s stacks", read, timeout, every=0.5)
        return doc
