"""The load simulator (``flightrec simulate``): its rings hold what it wrote, in the recorder's
records, and the config it writes is one the sidecar loads."""

from __future__ import annotations

import argparse
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.channel import RingReader
from collector.channel.blocks import RequestRecords, decode_columns
from collector.channel.codec import decode
from collector.channel.naming import parse_ring_file_name
from collector.cli import build_parser
from collector.cli.simulate import main as simulate_main
from collector.model import HALF_REQUESTS, Fingerprint, StepRecord, WorkloadArrival, WorkloadBatch, WorkloadEnd
from collector.settings import load_settings
from collector.sim.load import EngineLoad, Lanes, LoadConfig, Pacer, api_pid

VLLM_ID = re.compile(r"^cmpl-[0-9a-f]{32}-0$")


def read_ring(path: Path) -> tuple[list[dict[str, object]], list[object]]:
    metas, obs = [], []
    requests = RequestRecords()
    for payload in RingReader(path).read():
        meta, o = decode(payload, requests=requests)
        if meta is not None:
            metas.append(meta)
        else:
            obs.append(o)
    return metas, obs


def test_lanes_are_u32_columns() -> None:
    lanes = Lanes(3)
    lanes.set(0, 7)
    lanes.set(2, 0xFFFFFFFE)
    lanes.value += 1 | (1 << 64)  # grow lanes 0 and 2 by one
    assert [lanes.get(i) for i in range(3)] == [8, 0, 0xFFFFFFFF]
    assert lanes.tobytes() == (8).to_bytes(4, "little") + bytes(4) + b"\xff\xff\xff\xff"


def test_the_rings_hold_every_step_with_requests_growing_and_finishing(tmp_path: Path) -> None:
    cfg = LoadConfig(recorder_dir=tmp_path, engines=1, running=8, isl=100, osl=6, chunk=64, seed=3)
    engine = EngineLoad(cfg, 0, port=8000)
    for _ in range(40):
        engine.step()
    engine.close()
    rings = {parse_ring_file_name(p.name): p for p in tmp_path.glob("*.ring")}
    name = f"vllm-{api_pid(0)}"
    assert {(r.engine, r.role, r.pid) for r in rings if r} == {(name, "stats", api_pid(0)), (name, "sched", api_pid(0) + 1)}
    by_role = {r.role: read_ring(p) for r, p in rings.items() if r}
    for role in ("stats", "sched"):
        metas, obs = by_role[role]
        assert metas[0]["engine"] == name and metas[0]["role"] == role
        (fp,) = [o for o in obs if isinstance(o, Fingerprint)]
        assert fp.facts["server_pid"] == api_pid(0) and fp.facts["server_port"] == 8000
    steps = [o for o in by_role["stats"][1] if isinstance(o, StepRecord)]
    reqs = [o for o in by_role["sched"][1] if isinstance(o, StepRecord)]
    assert all(r.halves == HALF_REQUESTS for r in reqs) and not any(s.halves & HALF_REQUESTS for s in steps)
    assert [s.step for s in steps] == list(range(1, 41)) == [r.step for r in reqs]
    assert all(s.running == 8 and 0 < s.kv_cache_usage < 1 for s in steps)
    # every finish is counted in the step record (as vLLM's stat logger counts it, without
    # listing it), ends in one workload record, and its slot is refilled
    wl = [rec for o in by_role["sched"][1] if isinstance(o, WorkloadBatch) for rec in o.records]
    finished_ids = [w.request_id for w in wl if isinstance(w, WorkloadEnd)]
    assert not any(s.finished_requests for s in steps)
    assert sum(s.finished for s in steps) == len(finished_ids) > 8
    seen: dict[str, list[tuple[int, int, int]]] = {}
    for r in reqs:
        cols = decode_columns([r.request_block])
        assert len(cols["request_id"]) == 8 and set(cols["status"]) == {"running"}
        for rid, prompt, computed, output in zip(cols["request_id"], cols["prompt_len"], cols["computed_tokens"], cols["output_tokens"], strict=True):
            assert VLLM_ID.match(rid)
            seen.setdefault(rid, []).append((r.step, computed, output))
            if output:  # decoding: the last sampled token is not computed yet
                assert computed == prompt + output - 1
            else:  # chunked prefill: 64 prompt tokens a step
                assert computed % 64 == 0 or computed == prompt
    for history in seen.values():  # one more output token every step once decoding
        outs = [o for _, _, o in history if o]
        assert outs == list(range(outs[0], outs[0] + len(outs))) if outs else len(history) <= 2
    assert set(finished_ids) <= set(seen)
    arrivals = [w for w in wl if isinstance(w, WorkloadArrival)]
    assert len(arrivals) == len(finished_ids)
    assert all(w.max_tokens and w.max_tokens > 0 and w.prompt_len and w.prompt_len > 0 for w in arrivals)


def test_the_pacer_keeps_absolute_deadlines() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(dt: float) -> None:
        slept.append(dt)
        now[0] += dt + 0.003  # every sleep overshoots by 3 ms

    pacer = Pacer(100.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(101):
        pacer.wait()
    # overshoots do not add up: slot 100 is due at 1.0 s and is served within one overshoot
    assert now[0] == pytest.approx(1.003, abs=1e-9)
    assert pacer.late == 0 and pacer.max_lag == pytest.approx(0.003)


def test_simulate_writes_a_config_the_sidecar_loads_and_serves_vllm_metrics(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    summary = tmp_path / "summary.json"
    args = build_parser().parse_args(
        [
            "simulate",
            "--engines",
            "2",
            "--running",
            "16",
            "--steps-per-second",
            "50",
            "--duration",
            "3",
            "--recorder-dir",
            str(tmp_path / "rec"),
            "--write-config",
            str(config),
            "--serve-metrics",
            "--engine-name",
            "sim",
            "--summary-json",
            str(summary),
            "--progress-every",
            "0",
        ]
    )
    pages: list[str] = []

    def scrape() -> None:
        deadline = time.monotonic() + 10
        while not config.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        settings = load_settings(str(config))
        pages.extend(httpx.get(e.url + "/metrics").text for e in settings.engines)

    t = threading.Thread(target=scrape)
    t.start()
    assert simulate_main(args) == 0
    t.join()
    settings = load_settings(str(config))
    assert [e.name for e in settings.engines] == ["sim-0", "sim-1"]
    assert settings.recorder_dir == (tmp_path / "rec").resolve() and settings.nvml == "off"
    ring_engines = {parse_ring_file_name(p.name).engine for p in (tmp_path / "rec").glob("*.ring")}  # type: ignore[union-attr]
    assert ring_engines == {"sim-0", "sim-1"}
    assert len(pages) == 2
    names = {f.name for f in text_string_to_metric_families(pages[0])}
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens"} <= names
    assert not any(n.startswith(("vllm:hisparse", "vllm:nixl")) for n in names)  # no KV connector configured
    import json

    figures = json.loads(summary.read_text())
    # paced, not free-running: 2 x 50 steps/s over 3 s (a late step runs late, none is skipped)
    # (and each engine's last step, which holds nothing: the load is over)
    assert 240 <= figures["steps"] <= 302 and figures["request_rows"] == 16 * (figures["steps"] - 2)
    assert 0 < figures["cpu_share"] < 1


def test_without_metrics_the_config_names_no_engine_but_loads(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    args = argparse.Namespace(
        **vars(
            build_parser().parse_args(
                [
                    "simulate",
                    "--recorder-dir",
                    str(tmp_path / "rec"),
                    "--write-config",
                    str(config),
                    "--duration",
                    "0.2",
                    "--running",
                    "4",
                    "--progress-every",
                    "0",
                ]
            )
        )
    )
    assert simulate_main(args) == 0
    settings = load_settings(str(config))
    assert settings.engines == [] and settings.recorder_dir == (tmp_path / "rec").resolve()


def test_when_the_load_ends_its_last_step_holds_nothing_an_idle_engine_not_a_wedged_one(tmp_path: Path) -> None:
    from collector.sim.load_http import EngineMetrics

    cfg = LoadConfig(recorder_dir=tmp_path, engines=1, running=8, isl=100, osl=6, chunk=64, seed=3)
    engine = EngineLoad(cfg, 0, port=8000)
    page = EngineMetrics(engine)
    for _ in range(10):
        engine.step()
    assert 'vllm:num_requests_running{engine="0"' in page.page().decode()
    engine.drain()
    engine.drain()  # once only
    engine.close()
    rings = {parse_ring_file_name(p.name): p for p in tmp_path.glob("*.ring")}
    by_role = {r.role: read_ring(p) for r, p in rings.items() if r}
    steps = [o for o in by_role["stats"][1] if isinstance(o, StepRecord)]
    assert [s.step for s in steps] == list(range(1, 12)) and steps[-1].running == 0 and steps[-1].finished == 8
    wl = [rec for o in by_role["sched"][1] if isinstance(o, WorkloadBatch) for rec in o.records]
    aborted = [w for w in wl if isinstance(w, WorkloadEnd) and w.finish == "abort"]
    assert len(aborted) == 8  # every request it held ended
    # the step records it says it wrote are those its rings hold: the last step, nothing
    # scheduled, has its stats half alone
    blocks = [o for o in by_role["sched"][1] if isinstance(o, StepRecord)]
    assert engine.counters.steps == 11 and engine.counters.step_records == len(steps) + len(blocks) == 21
    running = [f for f in text_string_to_metric_families(page.page().decode()) if f.name == "vllm:num_requests_running"]
    assert [s.value for s in running[0].samples] == [0.0]
