"""The sidecar's own /metrics: read from the hub at scrape time, so the per-step path pays
nothing for it. Names are the ones the shipped Prometheus rules and Grafana dashboard use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class SidecarCollector(Collector):
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def collect(self) -> Iterable[Metric]:
        hub = self.ctx.hub
        up = GaugeMetricFamily("flightrec_engine_up", "1 if the engine answered lately", labels=["engine"])
        running = GaugeMetricFamily("flightrec_running_requests", "running requests at the last step", labels=["engine"])
        waiting = GaugeMetricFamily("flightrec_engine_waiting", "waiting requests at the last step", labels=["engine"])
        kv = GaugeMetricFamily("flightrec_engine_kv_cache_usage", "KV cache usage (0-1) at the last step", labels=["engine"])
        step = GaugeMetricFamily("flightrec_engine_last_step", "last engine step recorded", labels=["engine"])
        steps = CounterMetricFamily("flightrec_steps_received", "engine steps received from the recorder", labels=["engine"])
        mirror = GaugeMetricFamily("flightrec_mirror_rows", "host-mirror rows at the last step", labels=["engine"])
        source = GaugeMetricFamily("flightrec_engine_series_source", "1 for where an engine's live figures come from",
                                   labels=["engine", "source"])  # fmt: skip
        rows = CounterMetricFamily("flightrec_request_rows_received", "per-request rows received from the recorder",
                                   labels=["engine"])  # fmt: skip

        def put(fam: GaugeMetricFamily, name: str, value: float | None) -> None:
            if value is not None:  # unknown is absent, never 0
                fam.add_metric([name], float(value))

        for name, st in sorted(hub.engines.items()):
            up.add_metric([name], 1.0 if st.up else 0.0)
            steps.add_metric([name], st.steps_received)
            rows.add_metric([name], st.requests_received)
            last = st.ring.last()
            if last is not None:
                source.add_metric([name, "recorder"], 1.0)
                put(running, name, last.running)
                put(waiting, name, last.waiting)
                put(kv, name, last.kv_cache_usage)
                step.add_metric([name], last.step)
                put(mirror, name, last.mirror_rows)
            elif st.scrapes:  # an engine with /metrics only: its last scrape
                source.add_metric([name, "scrape"], 1.0)
                v = st.scrapes[-1].values
                put(running, name, v.get("num_requests_running"))
                put(waiting, name, v.get("num_requests_waiting"))
                put(kv, name, v.get("kv_cache_usage_perc"))
        yield from (up, running, waiting, kv, step, steps, mirror, source, rows)

        figures = self.ctx.ingest_figures()
        rec = figures["recorder"]
        lost = CounterMetricFamily("flightrec_recorder_lost_bytes", "ring bytes the writers overwrote before they were read")
        lost.add_metric([], rec.get("lost_bytes") or 0)
        bad = CounterMetricFamily("flightrec_recorder_bad_records", "ring records set aside (bad CRC or body)")
        bad.add_metric([], rec.get("bad_records") or 0)
        lag = GaugeMetricFamily("flightrec_recorder_lag_seconds", "age of the newest record read, worst ring")
        if rec.get("lag_s") is not None:
            lag.add_metric([], rec["lag_s"])
        loop_lag = GaugeMetricFamily("flightrec_loop_lag_seconds", "how late the sidecar's own event loop ran")
        loop_lag.add_metric([], figures["loop_lag_s"])
        pending = GaugeMetricFamily("flightrec_write_pending_rows", "rows queued for the database")
        pending.add_metric([], figures["rows_pending"])
        backlog = GaugeMetricFamily("flightrec_snapshots_waiting", "snapshots captured, not committed yet")
        backlog.add_metric([], figures["snapshot_backlog"])
        yield from (lost, bad, lag, loop_lag, pending, backlog)

        temp = GaugeMetricFamily("flightrec_gpu_temperature_celsius", "GPU temperature", labels=["gpu"])
        power = GaugeMetricFamily("flightrec_gpu_power_watts", "GPU power draw", labels=["gpu"])
        util = GaugeMetricFamily("flightrec_gpu_utilization_percent", "GPU utilisation", labels=["gpu"])
        mem = GaugeMetricFamily("flightrec_gpu_memory_used_bytes", "GPU memory used", labels=["gpu"])
        reasons = GaugeMetricFamily("flightrec_gpu_clock_event_reasons", "clock-event (throttle) reason mask", labels=["gpu"])
        ecc = CounterMetricFamily("flightrec_gpu_ecc_volatile_uncorrected", "volatile uncorrected ECC errors", labels=["gpu"])
        remap = CounterMetricFamily("flightrec_gpu_remapped_rows", "remapped rows", labels=["gpu", "kind"])
        for gpu, s in sorted(hub.gpu_meta.items()):
            for fam, value in ((temp, s.temperature), (power, s.power_w), (util, s.utilization),
                               (mem, s.memory_used), (reasons, s.clock_event_reasons),
                               (ecc, s.ecc_volatile_uncorrected)):  # fmt: skip
                if value is not None:
                    fam.add_metric([gpu], float(value))
            if s.remapped_rows_correctable is not None:
                remap.add_metric([gpu, "correctable"], s.remapped_rows_correctable)
            if s.remapped_rows_uncorrectable is not None:
                remap.add_metric([gpu, "uncorrectable"], s.remapped_rows_uncorrectable)
        yield from (temp, power, util, mem, reasons, ecc, remap)

        xid = CounterMetricFamily("flightrec_xid_events", "Xid errors seen (merged across sources)", labels=["gpu", "xid"])
        for (gpu, code), n in sorted(hub.xid_counts.items()):
            xid.add_metric([gpu, str(code)], n)
        yield xid

        snaps = CounterMetricFamily("flightrec_snapshots", "crash snapshots committed", labels=["engine", "trigger"])
        for (engine, trig), n in sorted(self.ctx.snapshot_counts.items()):
            snaps.add_metric([engine, trig], n)
        yield snaps

        src = GaugeMetricFamily("flightrec_source_up", "1 if the source works, 0 if failing", labels=["source"])
        sup = GaugeMetricFamily("flightrec_source_supported", "0 if the source cannot run on this node", labels=["source"])
        for status in self.ctx.source_statuses():
            src.add_metric([status.name], 1.0 if status.up else 0.0)
            sup.add_metric([status.name], 1.0 if status.supported else 0.0)
        yield from (src, sup)

        db = GaugeMetricFamily("flightrec_database_up", "1 if the last write succeeded")
        db.add_metric([], 0.0 if self.ctx.writer.db_up is False else 1.0)
        yield db
        dropped = CounterMetricFamily("flightrec_write_dropped", "rows dropped while the database was down")
        dropped.add_metric([], self.ctx.writer.dropped)
        yield dropped
        alerts = self.ctx.alert_stats()
        for key, value in alerts.items():
            fam = CounterMetricFamily(f"flightrec_alerts_{key}", f"alerts {key}")
            fam.add_metric([], value)
            yield fam
