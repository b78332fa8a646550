"""The simulated engine's /metrics: vLLM's own family names, types and labels
(``engine``, ``model_name``), exposed by prometheus_client as vLLM itself does."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class VllmMetrics:
    def __init__(self, *, engine_index: int, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        lv = (model_name, str(engine_index))
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=r).labels(*lv)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=r).labels(*lv)
        wbr = Gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", labels + ["reason"], registry=r)
        self.waiting_capacity = wbr.labels(*lv, "capacity")
        self.waiting_deferred = wbr.labels(*lv, "deferred")
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r).labels(*lv)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=r).labels(*lv)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r).labels(*lv)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r).labels(*lv)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.", labels + ["finished_reason"], registry=r).labels(*lv, "length")
        self.pc_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", labels, registry=r).labels(*lv)
        self.pc_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels, registry=r).labels(*lv)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels, buckets=LATENCY_BUCKETS, registry=r).labels(*lv)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, buckets=LATENCY_BUCKETS, registry=r).labels(*lv)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels, buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0), registry=r).labels(*lv)
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", labels, buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), registry=r).labels(*lv)
        self.host_cache = Gauge("vllm:hisparse_host_cache_usage_perc", "HiSparse host mirror pool usage (0-1).", labels, registry=r).labels(*lv)
        self.pending_pages = Gauge("vllm:hisparse_pending_page_transfers", "HiSparse page transfers in flight.", labels, registry=r).labels(*lv)
        self.nixl_failed = Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV transfers.", labels, registry=r).labels(*lv)
