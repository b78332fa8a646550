"""The simulated engines speak vLLM's real formats: checked against pages and lines captured
from a real vLLM, and against the parsers the sidecar uses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.channel import RingReader
from collector.channel.blocks import RequestRecords, decode_columns
from collector.channel.codec import decode
from collector.model import HALF_REQUESTS, HALF_STATS, Fingerprint, StepRecord
from collector.sim.engine import SimEngine
from collector.sim.pair import PairConfig, SimPair
from collector.sim.scenario import LoadClient, Phase, Scenario
from collector.xid.parser import parse_line

REAL_PAGES = sorted((Path(__file__).parents[1] / "fixtures" / "vllm-metrics").glob("*.txt"))
# made by vLLM's own HiSparse and NIXL metric classes (tests/sim/real_vllm_connector_page.py)
CONNECTOR_PAGE = Path(__file__).parent / "fixtures" / "connector-families.txt"
SMALL = Scenario(phases=(Phase(1, 1), Phase(2, 2), Phase(4, 4)), isl=1000, osl=40, crash_phase=2, crash_after_done=2, prefill_chunk=512)


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    out = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le", "quantile"}
        out[fam.name] = (fam.type, frozenset(labels))
    return out


def sim_page(tmp_path: Path) -> str:
    eng = SimEngine(
        name="decode-0", role="decode", scenario=SMALL, port=0, recorder_dir=tmp_path / "rec", log_path=tmp_path / "d.log", gpu_index=0, fake_pid=100
    )
    eng.waiting.append(LoadClient(SMALL).to_send()[0])
    eng.step()
    from prometheus_client import generate_latest

    return generate_latest(eng.metrics.registry).decode()


@pytest.mark.skipif(not REAL_PAGES, reason="no captured real vLLM pages")
def test_metric_names_types_and_labels_match_a_real_vllm(tmp_path: Path) -> None:
    sim = families(sim_page(tmp_path))
    real: dict[str, tuple[str, frozenset[str]]] = {}
    for page in [*REAL_PAGES, CONNECTOR_PAGE]:
        real.update(families(page.read_text()))
    # every family a real vLLM serves, the simulator serves, with vLLM's type and label names
    assert set(real) <= set(sim), sorted(set(real) - set(sim))
    for name in real:
        assert sim[name] == real[name], name
    # the one family the simulator has beyond these pages: a KV consumer's fetch stages, which
    # vLLM registers only on a decode engine of a P/D pair (vllm/v1/metrics/loggers.py)
    assert {n.removesuffix("_created") for n in sim if n not in real} == {"vllm:num_requests_kv_fetch_by_stage"}


@pytest.mark.skipif(not REAL_PAGES, reason="no captured real vLLM pages")
def test_every_family_has_vllms_help_and_buckets_and_a_scrape_weighs_what_a_real_one_does(tmp_path: Path) -> None:
    def detail(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
        out = {}
        for fam in text_string_to_metric_families(text):
            les = tuple(dict.fromkeys(s.labels["le"] for s in fam.samples if "le" in s.labels))
            out[fam.name] = (fam.documentation, les)
        return out

    page = sim_page(tmp_path)
    sim = detail(page)
    one_engine = [p for p in REAL_PAGES if not p.name.startswith("dp2")]
    for real_page in one_engine:
        real = detail(real_page.read_text())
        own = {n for n in real if n.startswith(("process_", "python_"))}  # the process's own: values differ, help and names not
        # (a family with no sample yet, as an idle server's request histograms, shows no buckets)
        assert {k: (sim[k][0], sim[k][1] if real[k][1] else ()) for k in real} == real, real_page.name
        assert own
    # as many bytes and samples as a real engine's page, within a fifth (the values differ)
    real_text = one_engine[0].read_text()
    samples = [line for line in page.splitlines() if line and not line.startswith("#")]
    real_samples = [line for line in real_text.splitlines() if line and not line.startswith("#")]
    assert 0.8 * len(real_samples) <= len(samples) <= 1.5 * len(real_samples)
    assert 0.7 * len(real_text) <= len(page) <= 1.5 * len(real_text)


def test_the_load_simulators_page_is_a_whole_server_page_that_counts_its_requests(tmp_path: Path) -> None:
    from collector.sim.load import EngineLoad, LoadConfig
    from collector.sim.load_http import EngineMetrics

    t = [1_000_000.0]
    load = EngineLoad(LoadConfig(recorder_dir=tmp_path, running=16, osl=8), 0, clock=lambda: t[0])
    try:
        for _ in range(40):
            t[0] += 0.01
            load.step()
        text = EngineMetrics(load).page().decode()
    finally:
        load.close()
    got = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels.get("le")}
    finished = load.counters.finished
    assert finished > 0
    assert got["vllm:request_success_total"] == finished
    assert got["vllm:request_generation_tokens_count"] == finished
    assert got["http_requests_total"] == finished
    assert got["process_resident_memory_bytes"] > 0


def test_connector_families_have_vllms_help_and_buckets(tmp_path: Path) -> None:
    def detail(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
        out = {}
        for fam in text_string_to_metric_families(text):
            if fam.name.startswith(("vllm:hisparse", "vllm:nixl")):
                les = tuple(s.labels["le"] for s in fam.samples if "le" in s.labels)
                out[fam.name] = (fam.documentation, les)
        return out

    real = detail(CONNECTOR_PAGE.read_text())
    sim = detail(sim_page(tmp_path))
    assert len(real) >= 13
    assert {k: sim[k] for k in real} == real


def test_step_records_travel_through_the_recorder_channel(tmp_path: Path) -> None:
    eng = SimEngine(
        name="decode-0", role="decode", scenario=SMALL, port=0, recorder_dir=tmp_path, log_path=tmp_path / "d.log", gpu_index=0, fake_pid=100
    )
    eng.waiting.extend(LoadClient(SMALL).to_send())
    for _ in range(5):
        eng.step()
    got: list[object] = []
    for ring in sorted(tmp_path.glob("decode-0.*.ring")):
        requests = RequestRecords()  # (a ring's R records are read in order)
        for payload in RingReader(ring).read():
            meta, obs = decode(payload, requests=requests)
            got.append(meta or obs)
    # the stat logger's half and the scheduler's half of each step, each with only its figures
    steps = [o for o in got if isinstance(o, StepRecord) and o.halves == HALF_STATS]
    reqs = [o for o in got if isinstance(o, StepRecord) and o.halves == HALF_REQUESTS]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5] == [r.step for r in reqs]
    assert all(s.request_block is None for s in steps)
    assert all(s.kv_cache_usage is not None and s.waiting is not None for s in steps)
    assert all(r.request_block is not None for r in reqs)
    assert all(r.waiting is None and r.kv_cache_usage is None for r in reqs)  # not the scheduler's figures
    block = reqs[-1].request_block
    assert block.column("prompt_len")[0] == 1000 and block.column("output_tokens")[0] == 5  # type: ignore[union-attr]
    last = decode_columns([reqs[-1].request_block])
    assert last["prompt_len"][0] == 1000 and last["output_tokens"][0] == 5
    assert last["mirror_rows"][0] == 1  # one decode row mirrored this step
    assert last["host_blocks"][0] == -(-(1000 + 5 - 1) // 64)  # host pages of its whole context
    assert any(k.startswith("HiSparseConnector.host_cache_usage_perc") for k in steps[-1].connector)
    (fp,) = [o for o in got if isinstance(o, Fingerprint)]
    assert fp.facts["block_size"] == 64 and fp.facts["env"]["NCCL_NET_PLUGIN"] == "none"
    assert fp.facts["cuda_graph_mode"] == "FULL"


def test_the_pair_ramps_and_dies_like_the_incident(tmp_path: Path) -> None:
    async def run() -> SimPair:
        pair = SimPair(PairConfig(workdir=tmp_path, recorder_dir=tmp_path / "rec", steps_per_second=4000, scenario=SMALL))
        await pair.start()
        url = f"http://127.0.0.1:{pair.decode.port}"
        async with httpx.AsyncClient() as c:
            assert (await c.get(url + "/health")).status_code == 200
            await asyncio.wait_for(pair.run(), 30)
            with pytest.raises(httpx.ConnectError):  # gone, not 503: like a real vLLM after EngineDeadError
                await c.get(url + "/health")
        await pair.close()
        return pair

    pair = asyncio.run(run())
    assert pair.client.history[-1] == (4, 2, 2)  # C4 phase: 2 done, 2 failed
    kmsg = pair.kmsg_path.read_text().splitlines()
    xid = parse_line(kmsg[-1])
    assert xid is not None and xid.xid == 43
    log = (tmp_path / "decode.log").read_text()
    for needle in (
        "(Worker_TP0 pid=",
        "(Worker_TP1 pid=",
        "_finish_mirror_phase",
        "graphs[desc].replay()",
        "torch.AcceleratorError: CUDA error: unspecified launch failure",
        "Dumping scheduler output",
        "Dumping scheduler stats: SchedulerStats(",
        "EngineCore encountered a fatal error.",
        "EngineDeadError",
    ):
        assert needle in log, needle


def test_the_simulated_crash_log_reads_like_a_real_one(tmp_path: Path) -> None:
    """The sidecar's own log parser finds in the simulated decode log what it finds in a real
    vLLM crash: both workers' CUDA errors with their frames, the crash dump as rows, the fatal
    error and the dead engine."""
    from collector.cli.inspect_log import inspect_log
    from collector.model import EventKind

    async def run() -> SimPair:
        pair = SimPair(PairConfig(workdir=tmp_path, recorder_dir=tmp_path / "rec", steps_per_second=4000, scenario=SMALL))
        await pair.start()
        await asyncio.wait_for(pair.run(), 30)
        await pair.close()
        return pair

    pair = asyncio.run(run())
    report = inspect_log(tmp_path / "decode.log")
    cuda = [e for e in report.events if e.kind is EventKind.CUDA_ERROR]
    assert sorted(e.process for e in cuda) == ["Worker_TP0", "Worker_TP1"]
    funcs = {f["func"] for e in cuda for f in e.frames}
    assert {"finish_forward", "_finish_mirror_phase", "run_fullgraph"} <= funcs
    assert all("unspecified launch failure" in e.message for e in cuda)
    (dump,) = report.crash_dumps
    rows = dump.data["requests"]
    assert sorted(r["request_id"] for r in rows) == sorted(r.request_id for r in pair.decode.running)
    assert dump.data["stats"]["kv_cache_usage"] == pytest.approx(pair.decode.kv_usage())
    kinds = {e.kind for e in report.events}
    assert {EventKind.ENGINE_FATAL, EventKind.ENGINE_DEAD} <= kinds


def test_the_simulated_gpus_read_through_the_real_nvml_source(tmp_path: Path) -> None:
    """The demo's NVML is the fake backend driven by the pair; the real NvmlSource reads it into
    samples whose process list names the engines' worker pids."""
    from collector.model import GpuSample
    from collector.sources.nvml import NvmlSource

    pair = SimPair(PairConfig(workdir=tmp_path, recorder_dir=tmp_path / "rec", scenario=SMALL))
    pair.decode.running.extend(LoadClient(SMALL).to_send())
    pair._gpu_values()
    got: list[GpuSample] = []

    class Sink:
        def emit(self, item: object) -> None:
            if isinstance(item, GpuSample):
                got.append(item)

    async def run() -> None:
        task = asyncio.create_task(NvmlSource(pair.nvml, interval=0.05, xid_events=False).run(Sink()))
        while len(got) < 2:
            await asyncio.sleep(0.02)
        task.cancel()

    asyncio.run(run())
    by_index = {s.index: s for s in got}
    assert by_index[1].processes[0]["pid"] == pair.decode.pids["Worker_TP0"]
    assert by_index[1].utilization is not None and by_index[1].utilization > by_index[0].utilization  # type: ignore[operator]
