"""The rest of a vLLM API server's /metrics page, beyond the step figures ``VllmMetrics`` keeps:
every other family a real vLLM 0.32 serves (``tests/fixtures/vllm-metrics``), with its type,
labels, help text and buckets, so that a scrape of a simulated engine reads and parses as many
bytes as one of a real engine (53 kB and 430 samples at one engine, not the 12 kB and 84
samples of the step figures alone).

Values: the server's own process, Python and GC collectors are prometheus_client's, as in vLLM;
the per-request histograms and the API's ``http_*`` families (prometheus-fastapi-instrumentator,
which leaves ``/metrics`` itself out) are observed for each finished request, from the
request's own sizes and times as the simulation knows them; what the simulation never does (a
multi-modal cache, an admission limit, a sleeping engine, the CPU build's zero FLOP estimates)
stays at the value a real engine that never did it serves. ``vllm:cache_config_info`` carries
the captured engine's cache config.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

# vLLM 0.32's buckets (vllm/v1/metrics/loggers.py), as its page shows them
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
N_BUCKETS = (1, 2, 5, 10, 20)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
# prometheus-fastapi-instrumentator's
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0)
HANDLER_BUCKETS = (0.1, 0.5, 1.0)
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
COMPLETIONS = "/v1/completions"
MAX_OBSERVED = 10_000  # requests observed per catch-up (a scrape after a long stall)
# the captured engine's (a tiny Llama on the CPU build)
CACHE_CONFIG = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "2.0",
    "kv_cache_memory_bytes": "4194304",
    "kv_cache_size_tokens": "4096",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "32",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


class ServerFamilies:
    """The families of one engine's API server beyond the step figures, in ``registry``."""

    def __init__(self, registry: CollectorRegistry, *, model_name: str, engine_index: int) -> None:
        r = registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        labels = ["model_name", "engine"]
        lv = (model_name, str(engine_index))

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*lv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*lv)

        self.prompt_len = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS)
        self.output_len = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS)
        self.max_generation = hist(
            "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", TOKEN_BUCKETS
        )
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKEN_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", TPOT_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", PHASE_BUCKETS)
        self.inference_time = hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", PHASE_BUCKETS)
        self.prefill_time = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", PHASE_BUCKETS)
        self.decode_time = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", PHASE_BUCKETS)
        self.preemptions = hist("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted.", PREEMPTION_BUCKETS)
        self.prefill_computed = hist(
            "vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", TOKEN_BUCKETS
        )
        for name, doc in (
            ("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations)."),
            ("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations)."),
            ("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations)."),
            (
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
            ),
            (
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
            ),
            ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
            ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
            ("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
        ):
            counter(name, doc)
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*labels, "sleep_state"],
            registry=r,
        )
        for state in SLEEP_STATES:
            sleep.labels(*lv, state).set(1.0 if state == "awake" else 0.0)
        by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*labels, "source"], registry=r)
        self.computed_tokens = by_source.labels(*lv, "local_compute")
        for source in PROMPT_SOURCES[1:]:
            by_source.labels(*lv, source)
        cached = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, "
            "p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to "
            "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            [*labels, "source"],
            registry=r,
        )
        for source in CACHED_SOURCES:
            cached.labels(*lv, source)
        rejections = Counter(
            "vllm:admission_rejections", "Number of admission attempts rejected by a queue limit, by reason.", ["model_name", "reason"], registry=r
        )
        for reason in ADMISSION_REASONS:
            rejections.labels(model_name, reason)
        config = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [*sorted({*CACHE_CONFIG, "engine"})], registry=r)
        config.labels(**{**CACHE_CONFIG, "engine": str(engine_index)}).set(1.0)
        # prometheus-fastapi-instrumentator's, for the API's requests
        self.http_requests = Counter(
            "http_requests", "Total number of requests by method, status and handler.", ["handler", "method", "status"], registry=r
        ).labels(COMPLETIONS, "POST", "2xx")

        def size(name: str, what: str) -> Summary:
            doc = f"Content length of {what} by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. "
            return Summary(name, doc, ["handler"], registry=r).labels(COMPLETIONS)

        self.http_request_size = size("http_request_size_bytes", "incoming requests")
        self.http_response_size = size("http_response_size_bytes", "outgoing responses")
        self.http_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
            buckets=HIGHR_BUCKETS,
            registry=r,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
            ["handler", "method"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        ).labels(COMPLETIONS, "POST")

    def finished(self, n: int, *, prompt_len: int, output_len: int, max_tokens: int, step_s: float, prefill_steps: int = 1) -> None:
        """``n`` requests ended, each of these sizes, at ``step_s`` seconds an engine step (the
        load's own pace): their histograms and the API's request families, as vLLM's output
        processor and the instrumentator observe each one."""
        prefill_s = prefill_steps * step_s
        decode_s = max(output_len - 1, 0) * step_s
        e2e = prefill_s + decode_s
        for _ in range(min(n, MAX_OBSERVED)):
            self.prompt_len.observe(prompt_len)
            self.output_len.observe(output_len)
            self.max_generation.observe(max_tokens)
            self.params_n.observe(1)
            self.params_max_tokens.observe(max_tokens)
            self.tpot.observe(step_s)
            self.queue_time.observe(0.0)
            self.inference_time.observe(e2e)
            self.prefill_time.observe(prefill_s)
            self.decode_time.observe(decode_s)
            self.prefill_computed.observe(prompt_len)
            self.http_requests.inc()
            self.http_request_size.observe(prompt_len * 6)  # a JSON body of token ids, ~6 bytes each
            self.http_response_size.observe(output_len * 4 + 300)
            self.http_highr.observe(e2e)
            self.http_duration.observe(e2e)
        self.computed_tokens.inc(n * prompt_len)
