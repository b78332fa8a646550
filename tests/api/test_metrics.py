"""The sidecar's /metrics: dcgm-exporter's GPU labels on every GPU series (the Xid counter
included, so picking a GPU shows its Xids), base-unit names, the commit-latency histogram,
process and build-info metrics, and `promtool check metrics` clean."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from prometheus_client import Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.api.metrics import commit_latency_histogram, observe_commit_latency, sidecar_registry
from collector.model import Event, EventKind, GpuSample, Severity, StepRecord
from tests.api.api_context import make_context

UUID = "GPU-5c1e0d2a-1111-2222-3333-444455556666"


def exposition(tmp_path, *, latency: Histogram | None = None) -> str:
    ctx = make_context(f"sqlite:///{tmp_path / 'm.db'}")
    now = time.time()
    ctx.hub.emit(StepRecord(engine="decode-0", ts=now, step=7, running=16, waiting=2, kv_cache_usage=0.032))
    ctx.hub.emit(
        GpuSample(
            gpu=UUID,
            index=1,
            ts=now,
            bus_id="0000:00:06.0",
            name="NVIDIA H200",
            utilization=87.0,
            temperature=61.0,
            memory_used=2**30,
            power_w=450.0,
            clock_event_reasons=0,
        )
    )
    # the kernel names the GPU by its PCI bus id, in its own short form
    ctx.hub.emit(
        Event(
            kind=EventKind.XID, ts=now, source="kmsg", message="NVRM: Xid (PCI:0000:00:06): 43", xid=43, gpu="0000:00:06.0", severity=Severity.WARNING
        )
    )
    ctx.snapshot_counts[("decode-0", "xid")] = 1
    hist = latency or commit_latency_histogram()
    return generate_latest(sidecar_registry(ctx, commit_latency=hist)).decode()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_gpu_series_and_xid_counter_carry_the_same_dcgm_labels(tmp_path) -> None:
    got = samples(exposition(tmp_path))
    [(gauge, value)] = got["flightrec_gpu_utilization_ratio"]
    assert value == pytest.approx(0.87)
    assert gauge == {"Hostname": "node-a", "gpu": "1", "UUID": UUID, "pci_bus_id": "00000000:00:06.0", "modelName": "NVIDIA H200"}
    [(xid, n)] = [(labels, v) for labels, v in got["flightrec_xid_events_total"] if labels["xid"] == "43"]
    assert n == 1
    assert {k: xid[k] for k in gauge} == gauge
    assert xid["xid"] == "43" and xid["severity"] == "warning"  # the catalog's severity for 43


def test_engine_series_are_named_alike_and_unknown_is_absent(tmp_path) -> None:
    got = samples(exposition(tmp_path))
    engine = {"Hostname": "node-a", "engine": "decode-0"}
    assert got["flightrec_engine_running_requests"] == [(engine, 16.0)]
    assert got["flightrec_engine_waiting_requests"] == [(engine, 2.0)]
    assert got["flightrec_engine_kv_cache_usage_ratio"] == [(engine, pytest.approx(0.032))]
    assert "flightrec_engine_mirror_rows" not in got  # never recorded: no sample, not 0
    assert not [n for n in got if n.endswith("_percent")]


def test_process_build_info_and_commit_histogram(tmp_path) -> None:
    hist = commit_latency_histogram()
    for seconds in (0.02, 0.2, 0.2, 3.0, -1.0, float("nan")):  # a clock step and NaN are not kept
        observe_commit_latency(seconds, hist)
    got = samples(exposition(tmp_path, latency=hist))
    assert got["flightrec_build_info"][0][0]["version"]
    assert "process_resident_memory_bytes" in got and "python_info" in got
    buckets = {labels["le"]: v for labels, v in got["flightrec_snapshot_commit_duration_seconds_bucket"]}
    assert buckets["0.025"] == 1 and buckets["0.25"] == 3 and buckets["2.5"] == 3 and buckets["+Inf"] == 4
    assert got["flightrec_snapshot_commit_duration_seconds_count"][0][1] == 4
    assert got["flightrec_snapshot_commit_duration_seconds_sum"][0][1] == pytest.approx(3.42)
    assert "flightrec_snapshot_commit_duration_seconds_created" not in got  # the series it always had


# dcgm-exporter's label names, kept on purpose so that our GPU series join theirs; promtool's
# linter flags camelCase label names, and these three are the only ones we have.
DCGM_CAMEL_CASE = {"UUID", "Hostname", "modelName"}
CAMEL_LINT = "label names should be written in 'snake_case' not 'camelCase'"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_check_metrics_is_clean(tmp_path) -> None:
    text = exposition(tmp_path)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip() and not ln.endswith(CAMEL_LINT)]
    assert problems == [], "\n".join(problems)
    names = {k for fam in text_string_to_metric_families(text) for s in fam.samples for k in s.labels}
    assert {n for n in names if n != n.lower()} == DCGM_CAMEL_CASE


def test_engine_info_names_the_pod_of_a_discovered_engine(tmp_path) -> None:
    from collector.model import SourceStatus
    from collector.sources.supervisor import SupervisedSource

    ctx = make_context(f"sqlite:///{tmp_path / 'm.db'}")
    ctx.hub.intake.engine("vllm-decode-0", url="http://10.244.3.18:8000", configured=True)
    ctx.hub.intake.engine("vllm-old-0", url="http://10.244.3.9:8000", configured=True, up=False)  # its pod was deleted

    class Discovery:
        name = "discovery"

        def status(self) -> list[SourceStatus]:
            engine = {"name": "vllm-decode-0", "namespace": "inference", "pod": "vllm-decode-0", "role": "decode", "pair": "pd-0", "followed": True}
            return [SourceStatus(name="discovery", up=True, details={"engines": [engine], "gone": ["vllm-old-0"]})]

    ctx.supervised.append(SupervisedSource(Discovery()))
    text = generate_latest(sidecar_registry(ctx)).decode()
    info = {s.labels["engine"]: s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == "flightrec_engine_info"}
    assert info["vllm-decode-0"] == {
        "Hostname": "node-a",
        "engine": "vllm-decode-0",
        "namespace": "inference",
        "pod": "vllm-decode-0",
        "role": "decode",
        "pair": "pd-0",
    }
    # a configured engine: no pod, its pair from the settings
    assert info["decode-0"]["pod"] == "" and info["decode-0"]["pair"] == "pd-0"
    # an engine whose pod is gone: no stale "down" to page on forever, no info
    up = {s.labels["engine"]: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "flightrec_engine_up"}
    assert "vllm-old-0" not in up and "vllm-old-0" not in info and up["vllm-decode-0"] == 0.0


def test_vllms_rates_under_the_sidecars_engine_name(tmp_path) -> None:
    """What a dashboard needs with no relabelling of vLLM's scrape: vLLM's counters as rates over
    the last scrape, labelled with the sidecar's engine name; a mean with no observation is absent."""
    from collector.model import MetricsScrape

    ctx = make_context(f"sqlite:///{tmp_path / 'm.db'}")
    rates = {"generation_tokens_total": 120.0, "prompt_tokens_total": 800.0, "num_preemptions_total": 0.5}
    rates |= {"time_to_first_token_seconds_sum": 0.9, "time_to_first_token_seconds_count": 3.0}
    rates |= {"inter_token_latency_seconds_sum": 0.0, "inter_token_latency_seconds_count": 0.0}
    ctx.hub.emit(MetricsScrape(engine="decode-0", ts=time.time(), values={"num_requests_running": 2.0}, rates=rates))
    # a fallback series from the log's stat line is no scrape: it does not replace the scrape's rates
    ctx.hub.emit(MetricsScrape(engine="decode-0", ts=time.time(), values={"generation_tokens_per_s": 1.0}, origin="log"))
    text = generate_latest(sidecar_registry(ctx)).decode()
    got = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("engine") == "decode-0"}
    assert got["flightrec_engine_generation_tokens_per_second"].value == 120.0
    assert got["flightrec_engine_prompt_tokens_per_second"].value == 800.0
    assert got["flightrec_engine_preemptions_per_second"].value == 0.5
    assert abs(got["flightrec_engine_time_to_first_token_mean_seconds"].value - 0.3) < 1e-9
    assert "flightrec_engine_inter_token_latency_mean_seconds" not in got  # no token in the interval: unknown


def test_counters_are_born_at_zero_for_every_label_set_known_before_the_first_event(tmp_path) -> None:
    """A counter whose first sample is already 1 shows no increase() to Prometheus: each engine's
    snapshot counter per trigger kind, and each known GPU's critical Xid codes, are exported at 0
    before anything happened; an Xid code outside those still appears (at 1) when it comes."""
    from collector.snapshot.freeze import TRIGGER_KIND_VALUES
    from collector.xid.catalog import default_catalog

    ctx = make_context(f"sqlite:///{tmp_path / 'm.db'}")
    now = time.time()
    ctx.hub.emit(StepRecord(engine="decode-0", ts=now, step=1, running=1, waiting=0, kv_cache_usage=0.01))
    ctx.hub.emit(GpuSample(gpu=UUID, index=1, ts=now, bus_id="0000:00:06.0", name="NVIDIA H200", temperature=40.0))
    got = samples(generate_latest(sidecar_registry(ctx)).decode())
    snaps = {(s["engine"], s["trigger"]): v for s, v in got["flightrec_snapshots_total"]}
    engines = {s["engine"] for s, _ in got["flightrec_engine_up"]}
    assert engines and set(snaps) == {(e, t) for e in engines for t in TRIGGER_KIND_VALUES}
    assert set(snaps.values()) == {0.0}
    critical = {str(c) for c in default_catalog().codes() if default_catalog().lookup(c).severity is Severity.CRITICAL}
    xids = {s["xid"]: (s["severity"], s["gpu"], s["UUID"], v) for s, v in got["flightrec_xid_events_total"]}
    assert set(xids) == critical and "79" in critical and "43" not in critical
    assert {(sev, gpu, uuid, v) for sev, gpu, uuid, v in xids.values()} == {("critical", "1", UUID, 0.0)}

    # the first Xid 79 counts 1 on the series that was 0; Xid 43 (a warning) is born at 1
    for i, (code, sev) in enumerate(((79, Severity.CRITICAL), (43, Severity.WARNING))):
        ctx.hub.emit(
            Event(
                kind=EventKind.XID,
                ts=now + 10 * i,
                source="kmsg",
                message=f"NVRM: Xid (PCI:0000:00:06): {code}",
                xid=code,
                gpu="0000:00:06.0",
                severity=sev,
            )
        )
    ctx.snapshot_counts[("decode-0", "xid")] = 1
    got = samples(generate_latest(sidecar_registry(ctx)).decode())
    xids = {s["xid"]: v for s, v in got["flightrec_xid_events_total"]}
    assert xids["79"] == 1 and xids["43"] == 1 and xids["48"] == 0
    snaps = {(s["engine"], s["trigger"]): v for s, v in got["flightrec_snapshots_total"]}
    assert snaps[("decode-0", "xid")] == 1 and snaps[("decode-0", "cuda_error")] == 0


def test_a_source_of_one_engine_carries_its_engine(tmp_path) -> None:
    """FlightrecSourceDown of a dead engine's scrape is inhibited by that engine's crash page:
    the series names the engine (node-wide sources have none)."""
    from collector.model import SourceStatus
    from collector.sources.supervisor import SupervisedSource

    ctx = make_context(f"sqlite:///{tmp_path / 'm.db'}")

    class Scrape:
        name = "vllm_metrics"

        def status(self) -> list[SourceStatus]:
            return [SourceStatus(name="vllm_metrics:decode-0", up=False), SourceStatus(name="kmsg", up=True)]

    ctx.supervised.append(SupervisedSource(Scrape()))
    got = samples(generate_latest(sidecar_registry(ctx)).decode())
    up = {s["source"]: (s.get("engine", ""), v) for s, v in got["flightrec_source_up"]}
    assert up["vllm_metrics:decode-0"] == ("decode-0", 0.0)
    assert up["kmsg"] == ("", 1.0)


def test_the_sidecars_memory_by_where_it_is(tmp_path) -> None:
    import platform

    got = samples(exposition(tmp_path))
    [(labels, blocks)] = got["flightrec_python_allocated_blocks"]
    assert labels == {"Hostname": "node-a"} and blocks > 10_000  # the interpreter's own objects at least
    [(_, sqlite)] = got["flightrec_sqlite_memory_bytes"]
    assert sqlite >= 0  # (SQLite's own count: tests/storage/test_connect.py)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        heap = {labels["state"]: v for labels, v in got["flightrec_malloc_bytes"]}
        assert set(heap) == {"in_use", "free", "mapped"} and heap["in_use"] > 1 << 20
    else:
        assert "flightrec_malloc_bytes" not in got  # unknown, not 0
