"""The sidecar's own /metrics: read from ingest's view at scrape time, so the per-step path pays
nothing for it. Names are the ones the shipped Prometheus rules and Grafana dashboard use;
labels are collector/alerting/labels.py's scheme (dcgm-exporter's for GPUs, ``Hostname`` on
every series), so an Xid counter and a GPU gauge of one GPU carry the same ``gpu``.

Naming: ``flightrec_engine_*`` per engine, ``flightrec_gpu_*`` per GPU, base units
(``_seconds``, ``_bytes``, ``_ratio`` for 0-1 fractions), ``_total`` on counters. Checked
with ``promtool check metrics`` (tests/api/test_metrics.py).

The snapshot commit latency is read from the one place that records it, the commit queue's
``CommitLatency`` (collector/snapshot/latency.py), and exposed as a histogram.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from collector import __version__, malloc
from collector.alerting.labels import ENGINE, HOSTNAME, METRIC_GPU_LABELS, gpu_labels
from collector.context import AppContext
from collector.ingest.view import IngestView
from collector.model import Severity
from collector.snapshot.freeze import TRIGGER_KIND_VALUES
from collector.snapshot.latency import BUCKETS, CommitLatency
from collector.storage.connect import sqlite_memory
from collector.xid.catalog import default_catalog
from collector.xid.catalog import lookup as xid_lookup

COMMIT_BUCKETS = BUCKETS
COMMIT_LATENCY_NAME = "flightrec_snapshot_commit_duration_seconds"
# The Xid codes each known GPU exports at 0 before any Xid: the catalog's critical ones, the
# faults that must never be missed (a warning code seen for the first time is born at 1 and the
# rule's `unless ... offset` clause catches it). 25 series per GPU.
CRITICAL_XIDS = tuple(c for c in default_catalog().codes() if default_catalog().lookup(c).severity is Severity.CRITICAL)


def commit_latency_histogram() -> CommitLatency:
    """An empty commit latency record with the histogram's buckets (a test's or a tool's own;
    the sidecar's is its commit queue's)."""
    return CommitLatency(COMMIT_BUCKETS)


def observe_commit_latency(seconds: float, latency: CommitLatency) -> None:
    """Record one snapshot commit in ``latency`` (a negative value or NaN is not kept)."""
    latency.observe(seconds)


def latency_histogram(latency: CommitLatency) -> HistogramMetricFamily:
    """The commit latency as the Prometheus histogram it always was (no ``_created``)."""
    hist = HistogramMetricFamily(COMMIT_LATENCY_NAME, "time from a fault's trigger to its snapshot's commit")
    hist.add_metric([], [(_le(bound), float(n)) for bound, n in latency.buckets()], sum_value=latency.sum)
    return hist


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes it (``0.01``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def sidecar_registry(ctx: AppContext, *, commit_latency: CommitLatency | None = None) -> CollectorRegistry:
    """Our collector plus prometheus_client's process, platform (python_info) and GC ones."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(ctx, commit_latency=commit_latency))
    registry.register(MemoryCollector(str(ctx.view.host)))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class SidecarCollector(Collector):
    def __init__(self, ctx: AppContext, *, commit_latency: CommitLatency | None = None) -> None:
        """``commit_latency``: read from there instead of the sidecar's commit queue (tests)."""
        self.ctx = ctx
        self._commit_latency = commit_latency

    @property
    def commit_latency(self) -> CommitLatency:
        return self._commit_latency if self._commit_latency is not None else self.ctx.committer.latency

    def collect(self) -> Iterable[Metric]:
        view = self.ctx.view
        host = str(view.host)
        info = GaugeMetricFamily("flightrec_build_info", "the running flight recorder's version", labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        yield from self._engines(view, host)
        yield self._engine_info(view, host)
        yield from self._ingest(host)
        yield from self._gpus(view, host)
        yield from self._sidecar(host)

    def _engines(self, view: IngestView, host: str) -> Iterable[Metric]:
        labels = [HOSTNAME, ENGINE]

        def g(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        up = g("flightrec_engine_up", "1 if the engine answered the last scrapes, else 0")
        running = g("flightrec_engine_running_requests", "running requests at the last recorded step")
        waiting = g("flightrec_engine_waiting_requests", "waiting requests at the last recorded step")
        kv = g("flightrec_engine_kv_cache_usage_ratio", "KV-cache usage (0-1) at the last recorded step")
        step = g("flightrec_engine_last_step", "number of the last engine step recorded")
        mirror = g("flightrec_engine_mirror_rows", "connector host-mirror rows at the last recorded step")
        steps = CounterMetricFamily("flightrec_engine_steps_received", "engine steps received from the recorder", labels=labels)
        rows = CounterMetricFamily("flightrec_engine_request_rows_received", "per-request rows received from the recorder", labels=labels)
        source = GaugeMetricFamily("flightrec_engine_series_source", "1 for where an engine's live figures come from", labels=[*labels, "source"])
        # vLLM's counters as rates over the sidecar's last /metrics scrape of the engine, labelled
        # with the sidecar's engine name: a dashboard shows them with no relabelling of vLLM's scrape
        gen = g("flightrec_engine_generation_tokens_per_second", "tokens generated per second (vLLM's counter, over the last scrape interval)")
        prompt = g("flightrec_engine_prompt_tokens_per_second", "prompt tokens computed per second (vLLM's counter, over the last scrape interval)")
        preempt = g("flightrec_engine_preemptions_per_second", "preemptions per second (vLLM's counter, over the last scrape interval)")
        ttft = g("flightrec_engine_time_to_first_token_mean_seconds", "mean time to first token of the requests seen over the last scrape interval")
        itl = g("flightrec_engine_inter_token_latency_mean_seconds", "mean inter-token latency over the last scrape interval")

        # a wedge (docs/alerting.md#wedged-engines): both born at 0 for every known engine
        wedged = g("flightrec_engine_wedged", "1 while the engine is wedged: requests held, no step for far longer than its pace")
        since_step = g("flightrec_engine_seconds_since_step", "seconds since the engine's last step while it holds requests, else 0")
        watch = getattr(self.ctx, "wedges", None)
        stuck = watch.seconds_since_step() if watch is not None else {}

        def put(fam: GaugeMetricFamily, key: list[str], value: float | None) -> None:
            if value is not None:  # unknown is absent, never 0
                fam.add_metric(key, float(value))

        for name in self._live_engines(view):
            st = view.engine(name)
            assert st is not None
            key = [host, name]
            up.add_metric(key, 1.0 if st.up else 0.0)
            steps.add_metric(key, st.steps_received)
            rows.add_metric(key, st.requests_received)
            verdict = view.engine_state(name)
            wedged.add_metric(key, 1.0 if verdict is not None and verdict.state == "wedged" else 0.0)
            since_step.add_metric(key, round(stuck.get(name, 0.0), 3))
            last = view.last_step(name)
            scrapes = view.scrapes(name)
            if last is not None:
                source.add_metric([*key, "recorder"], 1.0)
                put(step, key, last.step)
                for fam, figure in (
                    (running, "running"),
                    (waiting, "waiting"),
                    (kv, "kv_cache_usage"),
                    (mirror, "mirror_rows"),
                ):  # the last value a step carried
                    rec = view.last_known(name, figure)
                    put(fam, key, None if rec is None else getattr(rec, figure))
            last_scrape = next((sc for sc in reversed(scrapes) if sc.origin == "scrape"), None)
            if last_scrape is not None:
                r = last_scrape.rates
                put(gen, key, r.get("generation_tokens_total"))
                put(prompt, key, r.get("prompt_tokens_total"))
                put(preempt, key, r.get("num_preemptions_total"))
                put(ttft, key, _mean(r, "time_to_first_token_seconds"))
                put(itl, key, _mean(r, "inter_token_latency_seconds"))
            if last is None and scrapes:  # an engine with /metrics only: its last scrape
                source.add_metric([*key, "scrape"], 1.0)
                v = scrapes[-1].values
                put(running, key, v.get("num_requests_running"))
                put(waiting, key, v.get("num_requests_waiting"))
                put(kv, key, v.get("kv_cache_usage_perc"))
        yield from (up, running, waiting, kv, step, mirror, steps, rows, source, gen, prompt, preempt, ttft, itl, wedged, since_step)

    def _live_engines(self, view: IngestView) -> list[str]:
        """The engines known and not gone (a deleted pod's engine is no longer scraped: its last
        state is stale)."""
        gone = self._discovery().get("gone", [])
        return [n for n in sorted(view.engine_names()) if n not in gone and view.engine(n) is not None]

    def _engine_info(self, view: IngestView, host: str) -> Metric:
        """One series per engine naming where it runs, so that vLLM's own series (which carry
        ``namespace``/``pod`` through Kubernetes service discovery) and dcgm-exporter's (which
        carry them with its pod mapping) join the sidecar's ``engine`` without a relabelling:
        ``vllm:num_requests_running * on (namespace, pod) group_left (engine) flightrec_engine_info``."""
        info = GaugeMetricFamily(
            "flightrec_engine_info",
            "1 per engine: its pod (discovered engines) and P/D role and pair",
            labels=[HOSTNAME, ENGINE, "namespace", "pod", "role", "pair"],
        )
        details = self._discovery()
        found = {str(e["name"]): e for e in details.get("engines", []) if e.get("followed")}
        gone = details.get("gone", [])
        for name in sorted(view.engine_names()):
            st = view.engine(name)
            if st is None or name in gone:
                continue
            e = found.get(name, {})
            info.add_metric([host, name, e.get("namespace") or "", e.get("pod") or "", e.get("role") or "", e.get("pair") or st.pair or ""], 1.0)
        return info

    def _discovery(self) -> dict[str, Any]:
        """Kubernetes discovery's status details (engines followed, engines gone), or {}."""
        statuses = getattr(self.ctx, "source_statuses", None)
        for status in statuses() if callable(statuses) else []:
            if status.name == "discovery":
                return dict(status.details)
        return {}

    def _ingest(self, host: str) -> Iterable[Metric]:
        figures_of = getattr(self.ctx, "ingest_figures", None)
        if figures_of is None:
            return
        figures = figures_of()
        rec = figures.get("recorder") or {}
        h = [HOSTNAME]
        lost = CounterMetricFamily("flightrec_recorder_lost_bytes", "ring bytes the writers overwrote before they were read", labels=h)
        lost.add_metric([host], rec.get("lost_bytes") or 0)
        bad = CounterMetricFamily("flightrec_recorder_bad_records", "ring records set aside (bad CRC or body)", labels=h)
        bad.add_metric([host], rec.get("bad_records") or 0)
        lag = GaugeMetricFamily("flightrec_recorder_lag_seconds", "age of the newest record read, worst ring", labels=h)
        if rec.get("lag_s") is not None:
            lag.add_metric([host], rec["lag_s"])
        loop_lag = GaugeMetricFamily("flightrec_loop_lag_seconds", "how late the sidecar's own event loop ran", labels=h)
        if figures.get("loop_lag_s") is not None:
            loop_lag.add_metric([host], figures["loop_lag_s"])
        pending = GaugeMetricFamily("flightrec_write_pending_rows", "rows queued for the database", labels=h)
        if figures.get("rows_pending") is not None:
            pending.add_metric([host], figures["rows_pending"])
        backlog = GaugeMetricFamily("flightrec_snapshots_waiting", "snapshots captured, not committed yet", labels=h)
        if figures.get("snapshot_backlog") is not None:
            backlog.add_metric([host], figures["snapshot_backlog"])
        # the degrade order under overload (docs/architecture.md, "when the sidecar falls behind")
        gaps = CounterMetricFamily("flightrec_recorder_gaps", "times a ring's unread records were skipped (a gap in the step series)", labels=h)
        gaps.add_metric([host], rec.get("gaps") or 0)
        gap_bytes = CounterMetricFamily("flightrec_recorder_gap_bytes", "ring bytes skipped unread", labels=h)
        gap_bytes.add_metric([host], rec.get("gap_bytes") or 0)
        thinned = CounterMetricFamily("flightrec_steps_thinned", "step rows not stored while the stored series was coarser", labels=h)
        thinned.add_metric([host], figures.get("steps_thinned") or 0)
        coarse = GaugeMetricFamily("flightrec_series_coarse", "1 while the continuous series are coarser (the sidecar is behind)", labels=h)
        coarse.add_metric([host], 1.0 if rec.get("coarse") else 0.0)
        yield from (lost, bad, lag, loop_lag, pending, backlog, gaps, gap_bytes, thinned, coarse)

    def _gpus(self, view: IngestView, host: str) -> Iterable[Metric]:
        labels = [HOSTNAME, *METRIC_GPU_LABELS]
        last_sample = view.gpus()
        meta = list(last_sample.values())
        temp = GaugeMetricFamily("flightrec_gpu_temperature_celsius", "GPU temperature", labels=labels)
        power = GaugeMetricFamily("flightrec_gpu_power_watts", "GPU power draw", labels=labels)
        util = GaugeMetricFamily("flightrec_gpu_utilization_ratio", "GPU utilisation (0-1) over NVML's last sample period", labels=labels)
        mem = GaugeMetricFamily("flightrec_gpu_memory_used_bytes", "GPU memory used", labels=labels)
        reasons = GaugeMetricFamily("flightrec_gpu_clock_event_reasons", "clock-event (throttle) reason bit mask", labels=labels)
        ecc = CounterMetricFamily("flightrec_gpu_ecc_volatile_uncorrected", "volatile uncorrected ECC errors", labels=labels)
        remap = CounterMetricFamily("flightrec_gpu_remapped_rows", "remapped rows", labels=[*labels, "kind"])
        for gpu, s in sorted(last_sample.items()):
            key = [host, *gpu_labels(gpu, meta).values()]
            utilization = None if s.utilization is None else float(s.utilization) / 100.0
            for fam, value in (
                (temp, s.temperature),
                (power, s.power_w),
                (util, utilization),
                (mem, s.memory_used),
                (reasons, s.clock_event_reasons),
                (ecc, s.ecc_volatile_uncorrected),
            ):
                if value is not None:
                    fam.add_metric(key, float(value))
            if s.remapped_rows_correctable is not None:
                remap.add_metric([*key, "correctable"], s.remapped_rows_correctable)
            if s.remapped_rows_uncorrectable is not None:
                remap.add_metric([*key, "uncorrectable"], s.remapped_rows_uncorrectable)
        yield from (temp, power, util, mem, reasons, ecc, remap)

        # severity is the Xid catalog's, so the shipped rule pages each Xid as the sidecar does.
        # Born at 0: each GPU NVML lists gets its critical codes' series before any Xid (a series
        # whose first sample is 1 shows no increase() to Prometheus); any other code appears at
        # 1 when it first comes, which the rule catches with its `unless ... offset` clause.
        xid = CounterMetricFamily("flightrec_xid_events", "Xid errors seen (kernel log and NVML merged)", labels=[*labels, "xid", "severity"])
        # keyed by the labels: the kernel names a GPU by its bus id, NVML by its UUID
        counts: dict[tuple[str, ...], int] = {}
        for (gpu, code), n in view.xid_counts().items():
            labelled = (host, *gpu_labels(None if gpu == "unknown" else gpu, meta).values(), str(code))
            counts[labelled] = counts.get(labelled, 0) + n
        for gpu in last_sample:
            for code in CRITICAL_XIDS:
                counts.setdefault((host, *gpu_labels(gpu, meta).values(), str(code)), 0)
        for xid_key, n in sorted(counts.items(), key=lambda kv: (kv[0][:-1], int(kv[0][-1]))):
            xid.add_metric([*xid_key, xid_lookup(int(xid_key[-1])).severity.value], n)
        yield xid

    def _sidecar(self, host: str) -> Iterable[Metric]:
        snaps = CounterMetricFamily("flightrec_snapshots", "snapshots committed, by the kind of their trigger", labels=[HOSTNAME, ENGINE, "trigger"])
        # born at 0 for every engine the sidecar knows and every kind that can trigger a snapshot
        counts = dict(self.ctx.snapshot_counts)
        for name in self._live_engines(self.ctx.view):
            for trig in TRIGGER_KIND_VALUES:
                counts.setdefault((name, trig), 0)
        for (engine, trig), n in sorted(counts.items()):
            snaps.add_metric([host, engine, trig], n)
        yield snaps
        yield latency_histogram(self.commit_latency)

        # a source of one engine (``vllm_metrics:decode-0``, ``engine_log:decode-0``) carries that
        # engine, so Alertmanager quiets its FlightrecSourceDown under the engine's own crash page
        src = GaugeMetricFamily("flightrec_source_up", "1 if the source works, 0 if failing", labels=[HOSTNAME, "source", ENGINE])
        sup = GaugeMetricFamily("flightrec_source_supported", "0 if the source cannot run on this node", labels=[HOSTNAME, "source", ENGINE])
        for status in self.ctx.source_statuses():
            key = [host, status.name, status.name.partition(":")[2]]
            src.add_metric(key, 1.0 if status.up else 0.0)
            sup.add_metric(key, 1.0 if status.supported else 0.0)
        yield from (src, sup)

        task_up = GaugeMetricFamily("flightrec_task_up", "1 if the sidecar's task runs, 0 while it waits to restart", labels=[HOSTNAME, "task"])
        restarts = CounterMetricFamily("flightrec_task_restarts", "restarts of the sidecar's task after it failed", labels=[HOSTNAME, "task"])
        tasks = getattr(self.ctx, "tasks", None)
        for t in tasks.statuses() if tasks is not None else []:
            if not t.done:  # a task that finished its job (the late migration) is no series
                task_up.add_metric([host, t.name], 1.0 if t.up else 0.0)
            restarts.add_metric([host, t.name], t.restarts)
        yield from (task_up, restarts)

        db = GaugeMetricFamily("flightrec_database_up", "1 unless the last database write failed or the database is hung", labels=[HOSTNAME])
        up_of = getattr(self.ctx, "database_up", None)
        db_up = up_of() if callable(up_of) else self.ctx.writer.db_up
        db.add_metric([host], 0.0 if db_up is False else 1.0)
        yield db
        dropped = CounterMetricFamily("flightrec_write_dropped_rows", "rows dropped while the database was down", labels=[HOSTNAME])
        dropped.add_metric([host], self.ctx.writer.dropped)
        yield dropped
        alerts = CounterMetricFamily("flightrec_alerts", "alerts sent to Alertmanager, by outcome", labels=[HOSTNAME, "outcome"])
        for outcome, value in sorted(self.ctx.alert_stats().items()):
            alerts.add_metric([host, outcome], value)
        yield alerts


class MemoryCollector(Collector):
    """Where the sidecar process's memory is, beside prometheus_client's process collector (and
    like it not part of the sidecar's own state): the C heap by state, SQLite's share of it, and
    how many blocks Python's own allocator holds for live objects (flat while the resident size
    climbs: the growth is not live objects). A figure glibc or SQLite cannot give is absent."""

    def __init__(self, host: str) -> None:
        self.host = host

    def collect(self) -> Iterable[Metric]:
        host = self.host
        heap = malloc.usage()
        if heap is not None:
            fam = GaugeMetricFamily(
                "flightrec_malloc_bytes", "the sidecar's C heap (glibc's mallinfo2): in_use, free (held), mapped", labels=[HOSTNAME, "state"]
            )
            for state, value in heap.items():
                fam.add_metric([host, state], float(value))
            yield fam
        blocks = GaugeMetricFamily(
            "flightrec_python_allocated_blocks", "memory blocks Python's allocator holds for live objects (sys.getallocatedblocks)", labels=[HOSTNAME]
        )
        blocks.add_metric([host], float(sys.getallocatedblocks()))
        yield blocks
        held = sqlite_memory()
        if held is not None:
            fam = GaugeMetricFamily("flightrec_sqlite_memory_bytes", "memory SQLite holds in the sidecar: page caches, statements", labels=[HOSTNAME])
            fam.add_metric([host], float(held))
            yield fam


def _mean(rates: dict[str, float], histogram: str) -> float | None:
    """A histogram's mean over the interval its _sum and _count rates cover; None (unknown) when
    no observation fell in it."""
    total, count = rates.get(histogram + "_sum"), rates.get(histogram + "_count")
    if total is None or not count:
        return None
    return total / count
