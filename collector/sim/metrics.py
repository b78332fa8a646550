"""The simulated engine's /metrics: vLLM's own family names, types, labels (``engine``,
``model_name``) and help texts, exposed by prometheus_client as vLLM itself does.

The core families are checked against pages captured from a real vLLM
(``tests/fixtures/vllm-metrics``); the HiSparse and NIXL families against the page vLLM's own
connector metric classes make (``tests/sim/fixtures/connector-families.txt``), with their
buckets. ``ServerFamilies`` adds the rest of a real server's page (process, Python, the API's
``http_*``, the per-request histograms), so that a scrape weighs what a real one does.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from collector.sim.server_families import PHASE_BUCKETS, TPOT_BUCKETS, ServerFamilies

NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class VllmMetrics:
    def __init__(self, *, engine_index: int, model_name: str, kv_consumer: bool = False, connectors: bool = True) -> None:
        """``connectors``: the deployment has NIXL and HiSparse under MultiConnector, whose
        families vLLM registers only then; ``kv_consumer``: it is the decode side of a P/D pair."""
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        lv = (model_name, str(engine_index))
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=r).labels(*lv)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=r).labels(*lv)
        wbr = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by "
            "transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels + ["reason"],
            registry=r,
        )
        self.waiting_capacity = wbr.labels(*lv, "capacity")
        self.waiting_deferred = wbr.labels(*lv, "deferred")
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r).labels(*lv)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=r).labels(*lv)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r).labels(*lv)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r).labels(*lv)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.", labels + ["finished_reason"], registry=r).labels(
            *lv, "length"
        )
        self.pc_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", labels, registry=r
        ).labels(*lv)
        self.pc_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels, registry=r).labels(*lv)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels, buckets=PHASE_BUCKETS, registry=r
        ).labels(*lv)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, buckets=TTFT_BUCKETS, registry=r
        ).labels(*lv)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            labels,
            buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
            registry=r,
        ).labels(*lv)
        # every other family of the server's page, as vLLM serves it
        self.server = ServerFamilies(r, model_name=model_name, engine_index=engine_index)
        self.kv_fetch_in_progress: Gauge | None = None
        if not connectors:
            return
        # HiSparse (vllm/distributed/kv_transfer/kv_connector/v1/hisparse/stats.py)
        self.hisparse_hits = Counter("vllm:hisparse_cache_hits", "Number of HiSparse device hot-buffer hits.", labels, registry=r).labels(*lv)
        self.hisparse_misses = Counter("vllm:hisparse_cache_misses", "Number of HiSparse device hot-buffer misses.", labels, registry=r).labels(*lv)
        self.hisparse_h2d_bytes = Counter(
            "vllm:hisparse_host_to_device_bytes", "Bytes transferred from host KV storage to HiSparse hot buffers.", labels, registry=r
        ).labels(*lv)
        self.host_cache = Gauge(
            "vllm:hisparse_host_cache_usage_perc",
            "HiSparse host KV-cache usage. 1 means 100 percent usage. Evictable cached blocks count as free.",
            labels,
            registry=r,
        ).labels(*lv)
        self.pending_pages = Gauge(
            "vllm:hisparse_pending_page_transfers", "HiSparse page transfers (write-backs and restores) not yet completed.", labels, registry=r
        ).labels(*lv)
        # NIXL (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py)
        self.nixl_xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            labels,
            buckets=NIXL_TIME_BUCKETS[1:],
            registry=r,
        ).labels(*lv)
        self.nixl_post_time = Histogram(
            "vllm:nixl_post_time_seconds",
            "Histogram of transfer post time for NIXL KV Cache transfers.",
            labels,
            buckets=NIXL_TIME_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.nixl_bytes = Histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            labels,
            buckets=[2 ** (10 + i) for i in range(1, 25, 2)],
            registry=r,
        ).labels(*lv)
        self.nixl_descriptors = Histogram(
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL  KV Cache transfers.",
            labels,
            buckets=NIXL_DESCRIPTOR_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.nixl_failed = Counter(
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers, including handshake and notification failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
            labels,
            registry=r,
        ).labels(*lv)
        self.nixl_failed_notifications = Counter(
            "vllm:nixl_num_failed_notifications",
            "Number of failed NIXL KV Cache notifications. Retained for compatibility; these failures are also included in vllm:nixl_num_failed_transfers.",
            labels,
            registry=r,
        ).labels(*lv)
        self.nixl_expired = Counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
            labels,
            registry=r,
        ).labels(*lv)
        self.nixl_after_expiry = Counter(
            "vllm:nixl_num_notifications_after_expiry",
            "Number of completion notifications for requests that were no longer tracked, usually because their KV lease expired. The KV blocks may have been reused before the transfer finished. Counted per notification (one per remote rank), not per request.",
            labels,
            registry=r,
        ).labels(*lv)
        # a KV consumer's waiting requests by fetch stage (vllm/v1/metrics/loggers.py)
        if kv_consumer:
            fetch = Gauge(
                "vllm:num_requests_kv_fetch_by_stage",
                "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs an async KV load that has not started; 'in_progress' = load started and not yet reported finished; 'completed_waiting' = load finished, request not running yet.",
                labels + ["stage"],
                registry=r,
            )
            for stage in KV_FETCH_STAGES:
                fetch.labels(*lv, stage).set(0)
            self.kv_fetch_in_progress = fetch.labels(*lv, "in_progress")
