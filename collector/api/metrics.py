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
        for name, st in sorted(hub.engines.items()):
            up.add_metric([name], 1.0 if st.up else 0.0)
            steps.add_metric([name], st.steps_received)
            last = st.ring.last()
            if last is not None:
                running.add_metric([name], last.running)
                waiting.add_metric([name], last.waiting)
                kv.add_metric([name], last.kv_cache_usage)
                step.add_metric([name], last.step)
                if last.mirror_rows is not None:
                    mirror.add_metric([name], last.mirror_rows)
        yield from (up, running, waiting, kv, step, steps, mirror)

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
        dropped.add_metric([], hub.pending.dropped)
        yield dropped
        alerts = self.ctx.alert_stats()
        for key, value in alerts.items():
            fam = CounterMetricFamily(f"flightrec_alerts_{key}", f"alerts {key}")
            fam.add_metric([], value)
            yield fam
