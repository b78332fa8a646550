"""Run with vLLM's Python: the ``/metrics`` families vLLM's own HiSparse and NIXL connector
metrics register (``HiSparsePromMetrics``, ``NixlPromMetrics``), with one step's stats observed,
as a Prometheus text page on stdout (``tests/sim/fixtures/connector-families.txt``).

The CPU build cannot start an engine with these connectors (no NIXL, no CUDA), so the page is
made from the classes themselves, the way vLLM's ``PrometheusStatLogger`` builds them.
"""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats import HiSparsePromMetrics
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlPromMetrics

LABELS = ["model_name", "engine"]
PER_ENGINE: dict[int, list[object]] = {0: ["deepseek-ai/DeepSeek-V3.2-Exp", "0"]}


def main() -> None:
    config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="MultiConnector", is_kv_consumer=True),
        observability_config=SimpleNamespace(kv_cache_metrics=False, custom_histogram_buckets=None),
    )
    types = {Gauge: Gauge, Counter: Counter, Histogram: Histogram}
    hisparse = HiSparsePromMetrics(config, types, LABELS, PER_ENGINE)  # type: ignore[arg-type]
    hisparse.observe(
        {"cache_hits": [120], "cache_misses": [8], "host_to_device_bytes": [1 << 20], "host_cache_usage_perc": [0.25], "pending_page_transfers": [3]}
    )
    nixl = NixlPromMetrics(config, types, LABELS, PER_ENGINE)  # type: ignore[arg-type]
    nixl.observe(
        {
            "transfer_duration": [0.02],
            "post_duration": [0.001],
            "bytes_transferred": [1 << 24],
            "num_descriptors": [64],
            "num_failed_transfers": [],
            "num_failed_notifications": [],
            "num_failed_handshakes": [],
            "num_kv_expired_reqs": [],
            "num_notifications_after_expiry": [],
        }
    )
    text = generate_latest(REGISTRY).decode()
    keep, out = False, []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            keep = line.split()[2].startswith("vllm:")
        if keep:
            out.append(line)
    print("\n".join(out))


if __name__ == "__main__":
    main()
