"""The Prometheus exporter: fills the registry that ``/metrics`` renders. It runs in the API
process.

The names, label names and bucket edges are vLLM's (``vllm/v1/metrics/loggers.py``), so a
dashboard built for vLLM works unchanged: the default prefix is vLLM's ``vllm:``
(``--metrics-prefix host`` gives ``host:``). prometheus_client adds ``_total`` to counters, as it does
for vLLM. Every series has the labels ``model_name`` and ``engine``, except
``cache_config_info``, which has the cache settings and ``engine``, as in vLLM.

vLLM metrics this exporter does not make: what host has no feature for (multimodal
caches, sleep mode, corrupted requests) and the deprecated names. The speculative-decoding
counters exist only for an engine started with ``--speculative-config``, ``lora_requests_info``
only with ``--enable-lora``. Three names are host's own: ``prefix_cache_hit_rate`` (hits / queries since start-up),
``num_requests_in_flight`` (prompts the API server is serving) and ``model_weights_bytes`` (what
the weights occupy, labelled with the quantization method).
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from host.sdk import StatLogger

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort")
WAITING_REASONS = ("capacity", "deferred")
KV_CONNECTOR_COUNTERS = {
    "external_hit_tokens": "Prompt tokens a KV connector supplied (external prefix hits) (host's own).",
    "load_bytes": "Bytes of KV cache a KV connector loaded into this engine's blocks (host's own).",
    "save_bytes": "Bytes of KV cache a KV connector saved or sent from this engine's blocks (host's own).",
    "failed_transfers": "KV transfers that failed (handshakes, reads, writes) (host's own).",
    "failed_loads": "Requests whose KV load failed and were recomputed or failed (host's own).",
}
"""The known ``SchedulerStats.kv_connector_stats`` keys, each a ``<prefix>:kv_connector_<key>_total``
counter; any other key a connector reports goes to ``<prefix>:kv_connector_other_total{stat=...}``."""
SPEC_DECODE_COUNTERS = {
    "num_drafts": "Number of spec decoding drafts.",
    "num_draft_tokens": "Number of draft tokens.",
    "num_accepted_tokens": "Number of accepted tokens.",
}
"""``SchedulerStats.spec_decoding`` totals, each a ``<prefix>:spec_decode_<key>_total`` counter (vLLM's
names); ``num_accepted_tokens_per_pos`` becomes ``spec_decode_num_accepted_tokens_per_pos_total{position}``."""


_FAMILIES: "weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]]" = weakref.WeakKeyDictionary()


def _family(kind: Any, name: str, *args: Any, registry: CollectorRegistry, **kwargs: Any) -> Any:
    """The metric family ``name`` of ``registry``, made on first use: with ``-dp N`` the N engines'
    loggers share each family, each with its own ``engine`` label value."""
    made = _FAMILIES.setdefault(registry, {})
    if name not in made:
        made[name] = kind(name, *args, registry=registry, **kwargs)
    return made[name]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class PrometheusStatLogger(StatLogger):
    """Counters, gauges and histograms of one engine, in ``context.registry``."""

    name = "prometheus"

    def __init__(self, context: Any = None, arg: str | None = None) -> None:
        super().__init__(context, arg)
        ctx = self.context
        prefix = ctx.metrics_prefix
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix or ""):
            raise ValueError(f"metrics prefix {prefix!r} is not a Prometheus name; use e.g. 'vllm' or 'host'")
        self.registry = ctx.registry if ctx.registry is not None else CollectorRegistry()
        self.prefix = prefix
        labels = ["model_name", "engine"]
        values = [ctx.model_name, str(ctx.engine_index)]
        model = getattr(ctx.config, "model", None)
        max_model_len = int(getattr(model, "max_model_len", None) or 8192)
        token_buckets = build_1_2_5_buckets(max_model_len)

        def gauge(name: str, doc: str) -> Any:
            return _family(Gauge, f"{prefix}:{name}", doc, labels, registry=self.registry).labels(*values)

        def counter(name: str, doc: str) -> Any:
            return _family(Counter, f"{prefix}:{name}", doc, labels, registry=self.registry).labels(*values)

        def histogram(name: str, doc: str, buckets: Any) -> Any:
            return _family(Histogram, f"{prefix}:{name}", doc, labels, buckets=buckets, registry=self.registry).labels(*values)

        # scheduler state
        self.running = gauge("num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        by_reason = _family(
            Gauge,
            f"{prefix}:num_requests_waiting_by_reason",
            "Number of waiting requests by reason: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = held back by a grammar still compiling. Sum of all reasons equals num_requests_waiting.",
            labels + ["reason"], registry=self.registry,
        )
        self.waiting_by_reason = {r: by_reason.labels(*values, r) for r in WAITING_REASONS}
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_hit_rate = gauge("prefix_cache_hit_rate", "Prefix-cache hits / queries since start-up, in tokens (host's own).")
        self.in_flight = gauge("num_requests_in_flight", "Prompts the API server is serving (host's own).")
        # counters
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_computed = counter(
            "prompt_tokens_computed",
            "Prompt tokens the model computed: neither a local prefix-cache hit nor loaded by a KV connector (host's own).",
        )
        # the KV connector's totals (SchedulerStats.kv_connector_stats), as counters: only for an
        # engine with --kv-transfer-config
        self.kv_counters: dict[str, Any] = {}
        self._kv_other: Any = None
        if getattr(ctx.config, "kv_transfer", None) is not None:
            self.kv_counters = {key: counter(f"kv_connector_{key}", doc) for key, doc in KV_CONNECTOR_COUNTERS.items()}
            self._kv_other = _family(
                Counter, f"{prefix}:kv_connector_other", "A KV connector's own counters, by name (host's own).",
                labels + ["stat"], registry=self.registry,
            )
        # speculative decoding's totals (SchedulerStats.spec_decoding), vLLM's names: only for an
        # engine with --speculative-config
        self.spec_counters: dict[str, Any] = {}
        self._spec_per_pos: Any = None
        if getattr(ctx.config, "speculative", None) is not None:
            self.spec_counters = {key: counter(f"spec_decode_{key}", doc) for key, doc in SPEC_DECODE_COUNTERS.items()}
            self._spec_per_pos = _family(
                Counter, f"{prefix}:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                labels + ["position"], registry=self.registry,
            )
        # --enable-lora: vLLM's info gauge, one series per (max_lora, waiting adapters, running
        # adapters) seen, set to the time it was last seen (SchedulerStats.lora_stats)
        self._lora_info: Any = None
        if getattr(ctx.config, "lora", None) is not None:
            self._lora_info = _family(
                Gauge, f"{prefix}:lora_requests_info", "Running stats on lora requests.",
                labels + ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=self.registry,
            )
        # --enable-eplb: the load balancer's balancedness and rearrangements (SchedulerStats.eplb_stats)
        self._eplb: dict[str, Any] = {}
        if getattr(getattr(ctx.config, "parallel", None), "enable_eplb", False):
            self._eplb = {
                "balancedness": gauge("eplb_balancedness", "Mean over max of the per-rank expert load in the last EPLB window."),
                "rearrangements": counter("eplb_rearrangements", "Expert rearrangements done."),
                "skipped": counter("eplb_rearrangements_skipped", "Expert rearrangements skipped (gain below min_improvement)."),
            }
        self._totals: dict[str, int] = {}  # the last totals seen (the engine sends totals, counters take increments)
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        success = _family(
            Counter,
            f"{prefix}:request_success", "Count of successfully processed requests.",
            labels + ["finished_reason"], registry=self.registry,
        )
        self._success_base = success
        self.success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        self._values = values
        # histograms of counts
        self.req_prompt_tokens = histogram("request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.req_generation_tokens = histogram("request_generation_tokens", "Number of generation tokens processed.", token_buckets)
        self.iteration_tokens = histogram("iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS)
        self.req_max_generation_tokens = histogram(
            "request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", token_buckets
        )
        self.req_n = histogram("request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.req_max_tokens = histogram("request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets)
        self.req_preemptions = histogram(
            "request_num_preemptions", "Histogram of the number of preemptions a finished request went through.", PREEMPTION_BUCKETS
        )
        self.req_prefill_kv_computed = histogram(
            "request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", token_buckets,
        )
        # histograms of times
        self.ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.req_tpot = histogram(
            "request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram(
            "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS
        )
        self.prefill_time = histogram(
            "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS
        )
        self.decode_time = histogram(
            "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS
        )
        self._cache_info = False

    def log_engine_initialized(self) -> None:
        """``cache_config_info``: a gauge fixed at 1 whose labels are the cache settings."""
        cache = getattr(self.config, "cache", None)
        if cache is None or self._cache_info:
            return
        info = {k: str(v) for k, v in dataclasses.asdict(cache).items()}
        blocks = self.context.engine_info.get("num_gpu_blocks")
        if blocks is not None:
            info["num_gpu_blocks"] = str(blocks)
        info["engine"] = str(self.engine_index)
        gauge = _family(Gauge, f"{self.prefix}:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=self.registry)
        gauge.labels(**info).set(1)
        weights = self.context.engine_info.get("weight_bytes")
        if weights is not None:
            quant = str(self.context.engine_info.get("quantization") or "none")
            w = _family(
                Gauge, f"{self.prefix}:model_weights_bytes",
                "Bytes the model's weights occupy on the device (quantized blocks and platform repacking included).",
                ["model_name", "engine", "quantization"], registry=self.registry,
            )
            w.labels(self.context.model_name, str(self.engine_index), quant).set(weights)
        self._cache_info = True

    def _add_total(self, key: str, total: int, metric: Any) -> None:
        """Advance a counter to an engine total (the engine sends totals; counters take increments)."""
        last = self._totals.get(key, 0)
        if total > last:
            metric.inc(total - last)
        self._totals[key] = total

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        s = scheduler_stats
        if s is not None:
            self.running.set(s.num_running_reqs)
            self.waiting.set(s.num_waiting_reqs)
            deferred = getattr(s, "num_waiting_deferred", 0)
            self.waiting_by_reason["capacity"].set(s.num_waiting_reqs - deferred)
            self.waiting_by_reason["deferred"].set(deferred)
            self.kv_usage.set(s.kv_cache_usage)
            self.prefix_hit_rate.set(s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0)
            self._add_total("prompt_tokens_computed", getattr(s, "num_prompt_tokens_computed", 0), self.prompt_computed)
            if self._kv_other is not None:
                for key, total in (getattr(s, "kv_connector_stats", None) or {}).items():
                    metric = self.kv_counters.get(key) or self._kv_other.labels(*self._values, key)
                    self._add_total(f"kv:{key}", total, metric)
            spec = getattr(s, "spec_decoding", None)
            if spec and self._spec_per_pos is not None:
                for key, metric in self.spec_counters.items():
                    self._add_total(f"spec:{key}", int(getattr(spec, key)), metric)
                for pos, total in enumerate(spec.num_accepted_tokens_per_pos):
                    self._add_total(f"spec:pos{pos}", int(total), self._spec_per_pos.labels(*self._values, str(pos)))
            eplb = getattr(s, "eplb_stats", None)
            if eplb is not None and self._eplb:
                if eplb.balancedness is not None:
                    self._eplb["balancedness"].set(eplb.balancedness)
                self._add_total("eplb:rearrangements", eplb.rearrangements, self._eplb["rearrangements"])
                self._add_total("eplb:skipped", eplb.skipped, self._eplb["skipped"])
            lora = getattr(s, "lora_stats", None)
            if lora and self._lora_info is not None:
                self._lora_info.labels(
                    *self._values, str(lora.max_lora), ",".join(sorted(lora.waiting)), ",".join(sorted(lora.running)),
                ).set_to_current_time()
        it = iteration_stats
        if it is None:
            return
        self.in_flight.set(it.num_requests_in_flight)
        if it.prefix_cache_queries:
            self.prefix_queries.inc(it.prefix_cache_queries)
        if it.prefix_cache_hits:
            self.prefix_hits.inc(it.prefix_cache_hits)
        if it.num_preemptions:
            self.preemptions.inc(it.num_preemptions)
        tokens = it.num_prompt_tokens + it.num_generation_tokens
        if tokens:
            self.prompt_tokens.inc(it.num_prompt_tokens)
            self.generation_tokens.inc(it.num_generation_tokens)
            self.iteration_tokens.observe(tokens)
        for value in it.time_to_first_tokens:
            self.ttft.observe(value)
        for value in it.inter_token_latencies:
            self.itl.observe(value)
        for req in it.finished_requests:
            for reason in req.finish_reasons:
                counter = self.success.get(reason)
                if counter is None:
                    counter = self.success[reason] = self._success_base.labels(*self._values, reason)
                counter.inc()
            self.e2e.observe(req.e2e_latency)
            self.queue_time.observe(req.queued_time)
            self.prefill_time.observe(req.prefill_time)
            self.decode_time.observe(req.decode_time)
            self.inference_time.observe(req.inference_time)
            self.req_tpot.observe(req.mean_time_per_output_token)
            self.req_prompt_tokens.observe(req.num_prompt_tokens)
            self.req_generation_tokens.observe(req.num_generation_tokens)
            self.req_max_generation_tokens.observe(req.max_num_generation_tokens)
            self.req_prefill_kv_computed.observe(max(req.num_prompt_tokens - max(req.num_cached_tokens, 0), 0))
            self.req_n.observe(req.n)
            self.req_preemptions.observe(req.num_preemptions)
            if req.max_tokens:
                self.req_max_tokens.observe(req.max_tokens)
