"""Engines that leave are forgotten: after the grace period a departed engine's rings, registry
record, detector series and ring readers are freed; its stored snapshots and events stay."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from collector.api.app import create_app
from collector.context import AppContext
from collector.detectors.task import DetectorTask
from collector.ingest.departures import Departures
from collector.ingest.hub import hub_for
from collector.model import MetricsScrape, StepRecord
from collector.parsers.kube_pods import PodEngine, engine_of_pod
from collector.recorder import EngineIdentity, RequestRecorder, StatsRecorder
from collector.settings import Settings
from collector.sources.discovery import KubernetesDiscovery
from collector.sources.join import EngineJoin
from collector.sources.kube_api import KubeApi
from collector.sources.recorder import RecorderSource
from collector.storage.connect import make_engine
from collector.storage.repo import Repository
from collector.storage.writer import BatchWriter
from tests.request_columns import Row, encode_rows
from tests.wiring import with_committer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
POD = json.loads((FIXTURES / "kubernetes" / "podlist-gpu-node-a.json").read_text())["items"][0]
T0 = 1_796_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_a_departed_engine_is_kept_for_its_grace_period_then_forgotten() -> None:
    clock = Clock()
    hub = hub_for(Settings(), clock=clock)
    intake = hub.intake
    detectors = DetectorTask(hub.view, hub.emit, Settings().detectors)
    departures = Departures(intake, forget_after_s=600.0, others=[detectors], clock=clock)
    for name in ("stays", "leaves"):
        intake.engine(name, url=f"http://{name}", configured=True)
        hub.emit(StepRecord(engine=name, ts=clock.now, step=1, running=1))
        hub.emit(MetricsScrape(engine=name, ts=clock.now, values={"num_requests_running": 1.0}))
    detectors.tick()
    assert {s.labels.get("engine") for s in detectors.states()} >= {"stays", "leaves"}
    intake.engine("leaves", up=False)  # discovery: its pod is gone
    clock.now += 599.0
    assert departures.sweep() == [] and hub.view.steps("leaves")  # still there for its death's snapshot
    clock.now += 1.0
    assert departures.sweep() == ["leaves"]
    assert hub.view.engine_names() == ["stays"] and hub.view.steps("leaves") == []
    assert "leaves" not in {s.labels.get("engine") for s in detectors.states()}
    assert "leaves" not in detectors.runner._scrape_series and "leaves" not in intake.store.engines


def test_an_engine_that_comes_back_within_its_grace_period_is_not_forgotten() -> None:
    clock = Clock()
    hub = hub_for(Settings(), clock=clock)
    departures = Departures(hub.intake, forget_after_s=600.0, clock=clock)
    hub.intake.engine("pod-0", url="http://pod-0", configured=True)
    hub.intake.engine("pod-0", up=False)
    clock.now += 300.0
    hub.intake.engine("pod-0", url="http://pod-0", configured=True)  # a pod of that name again
    clock.now += 600.0
    assert departures.sweep() == [] and hub.view.engine_names() == ["pod-0"]


def pod(i: int) -> PodEngine:
    obj = copy.deepcopy(POD)
    meta = obj["metadata"]
    meta["name"], meta["uid"] = f"vllm-churn-{i:03d}", f"00000000-0000-4000-8000-{i:012d}"
    obj["status"]["podIP"] = f"10.1.{i // 250}.{i % 250 + 1}"
    return engine_of_pod(obj, default_container="vllm", default_port=8000)


class Idle:
    """A pod's scrape source that the test stands in for (it emits the scrapes itself)."""

    def __init__(self, name: str) -> None:
        self.name = f"vllm_metrics:{name}"

    async def run(self, sink: Any) -> None:
        await asyncio.Event().wait()

    def status(self) -> list[Any]:
        return []


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Pod:
    """One engine pod's two recorders (small rings), writing as vLLM's adapters do."""

    def __init__(self, engine: PodEngine, folder: Path, run: int) -> None:
        identity = EngineIdentity(server_pid=7, name=engine.name, engine_version="0.32.0", run=run)
        self.stats = StatsRecorder(identity, directory=folder, capacity=1 << 18)
        self.sched = RequestRecorder(identity, directory=folder, capacity=1 << 20, pid=8)
        self.step = 0

    def steps(self, n: int, ts: float) -> None:
        rows = [Row(f"cmpl-{self.step:06d}-{j}", 2000, 2000 + j, j) for j in range(16)]
        for _ in range(n):
            self.step += 1
            self.stats.write_step(
                self.step, ts=ts, running=16, waiting=0, deferred=0, kv_cache_usage=0.3, preemptions=0, prompt_tokens=0,
                generation_tokens=16, finished=0, prefix_cache_queries=0, prefix_cache_hits=0,
            )  # fmt: skip
            self.sched.channel.write(encode_rows(self.step, ts, rows))

    def close(self) -> None:
        self.stats.close()
        self.sched.close()


def test_two_hundred_pods_come_and_go_for_an_hour_and_memory_returns_to_where_it_was(tmp_path: Path) -> None:
    """An hour of simulated time (the clock is driven, 30 s a tick): 200 engine pods through
    discovery, three or four arriving a minute, each living five minutes with its rings, scrapes
    and detector series, then deleted; forgotten ten minutes after. The sidecar's RSS in the last
    quarter of the hour is within 5% of the second quarter's (the same number of engines living
    and departing; 23% above it when nothing is forgotten), and /api/v1/engines lists only the
    living once the last departed pods' grace period is over."""
    clock = Clock()
    folder = tmp_path / "recorder"
    settings = Settings(engine_forget_after_s=600.0, database=f"sqlite:///{tmp_path / 'd.db'}")
    repo = Repository(make_engine(settings.database), host="node-a")
    writer = BatchWriter(repo, interval=1.0)
    # ingest alone: the committer (for the API's context) is not fed, as no fault is in this hour
    hub = hub_for(settings, clock=clock)
    _, committer = with_committer(settings, repo, clock=clock, spool_dir=tmp_path / "spool", settle_s=1.0, window_s=30.0)
    join = EngineJoin([])
    recorder = RecorderSource(folder, clock=clock, alive=lambda pid: True, join=join, join_wait=0.0, monotonic=clock)
    detectors = DetectorTask(hub.view, hub.emit, settings.detectors)
    departures = Departures(hub.intake, forget_after_s=settings.engine_forget_after_s, others=[detectors, recorder, writer], clock=clock)
    token = tmp_path / "token"
    token.write_text("t\n")
    discovery = KubernetesDiscovery(
        KubeApi("http://127.0.0.1:9", token_file=token),
        node="gpu-node-a",
        label_selector="flightrec.io/engine",
        metrics_factory=lambda e: Idle(e.name),
        join=join,
        forget_after_s=60.0,
        clock=clock,
    )
    ctx = AppContext(settings=settings, hub=hub, repo=repo, writer=writer, committer=committer, detectors=detectors, loop=asyncio.new_event_loop())

    async def hour() -> dict[str, Any]:
        discovery._sink = hub
        pods: dict[int, tuple[PodEngine, Pod, float]] = {}
        born = 0
        marks: dict[str, int] = {}
        for tick in range(121):  # 0 .. 3600 s
            if tick % 2 == 0 and born < 200:  # a minute: three or four pods arrive
                for _ in range(4 if (tick // 2) % 3 == 0 else 3):  # ten every three minutes
                    if born < 200:
                        engine = pod(born)
                        pods[born] = (engine, Pod(engine, folder, run=int(clock.now * 1000) + born), clock.now)
                        discovery.pods[engine.uid] = engine
                        born += 1
            for i, (engine, p, since) in list(pods.items()):
                if clock.now - since >= 300.0:  # deleted after five minutes
                    del discovery.pods[engine.uid]
                    p.close()
                    del pods[i]
            discovery._reconcile(from_start=True)
            await asyncio.sleep(0)
            for engine, p, _ in pods.values():
                p.steps(100, clock.now)
                hub.emit(MetricsScrape(engine=engine.name, ts=clock.now, values={"num_requests_running": 16.0, "num_requests_waiting": 0.0}))
            recorder.poll(hub)
            detectors.tick()
            departures.sweep()
            if tick in (60, 120):
                marks[f"rss_{tick}"] = rss()
                marks[f"engines_{tick}"] = len(hub.view.engine_names())
            clock.now += 30.0
        living = {e.name for e, _, _ in pods.values()}
        clock.now += settings.engine_forget_after_s  # the last departed pods' grace period ends
        departures.sweep()
        for _, p, _ in pods.values():
            p.close()
        for f in discovery.followed.values():
            for task in f.tasks.values():
                task.cancel()
        return {"living": living, "born": born, **marks}

    out = asyncio.run(hour())
    assert out["born"] == 200
    with TestClient(create_app(ctx)) as client:
        listed = {e["name"] for e in client.get("/api/v1/engines").json()["items"]}
    # departed pods stay ten minutes (down), then go: once the last ones' time is up, the living alone
    assert listed == out["living"] and len(listed) >= 10
    assert all(e["up"] for e in ctx.engines_live())
    assert abs(out["engines_60"] - out["engines_120"]) <= 4  # as many living and departing at both marks
    assert len(hub.intake.store.engines) == len(listed) and len(recorder._tails) == 2 * len(listed)
    assert out["rss_120"] <= out["rss_60"] * 1.05, out
