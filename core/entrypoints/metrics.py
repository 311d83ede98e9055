"""Prometheus metrics of one API server (served at ``/metrics``).

Counters: requests by finish reason, prompt and generated tokens. Histograms: time to first
token, inter-token latency, end-to-end latency. Gauges from the engine's per-step stats:
running and waiting requests, KV-cache usage, prefix-cache hit rate, preemptions. Names use the
``host:`` prefix, as vLLM uses ``vllm:``.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """The metrics of one server, in their own registry (several servers in one test process
    do not collide)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name
        r = self.registry
        self.requests = Counter("host:request_success", "Finished requests by finish reason", labels + ["finished_reason"], registry=r)
        self.prompt_tokens = Counter("host:prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self.generation_tokens = Counter("host:generation_tokens", "Tokens generated", labels, registry=r)
        self.ttft = Histogram("host:time_to_first_token_seconds", "Time to first token", labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("host:inter_token_latency_seconds", "Time between tokens", labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("host:e2e_request_latency_seconds", "Arrival to finish", labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.running = Gauge("host:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("host:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.kv_usage = Gauge("host:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1)", labels, registry=r)
        self.prefix_hit_rate = Gauge("host:prefix_cache_hit_rate", "Prefix-cache hits / queries (tokens)", labels, registry=r)
        self.prefix_queries = Gauge("host:prefix_cache_queries", "Prefix-cache queries (tokens, cumulative)", labels, registry=r)
        self.prefix_hits = Gauge("host:prefix_cache_hits", "Prefix-cache hits (tokens, cumulative)", labels, registry=r)
        self.preemptions = Gauge("host:num_preemptions", "Preemptions so far", labels, registry=r)
        self.in_flight = Gauge("host:num_requests_in_flight", "Requests the API server is serving", labels, registry=r)

    def on_request_start(self) -> None:
        self.in_flight.labels(self.model_name).inc()

    def on_request_end(self, timing: Any, result: Any, finished: bool) -> None:
        m = self.model_name
        self.in_flight.labels(m).dec()
        reasons = [c.finish_reason or "abort" for c in result.outputs] if finished else ["abort"]
        for reason in reasons:
            self.requests.labels(m, reason).inc()
        self.prompt_tokens.labels(m).inc(len(result.prompt_token_ids))
        self.generation_tokens.labels(m).inc(sum(len(c.token_ids) for c in result.outputs))
        if timing.first_token is not None:
            self.ttft.labels(m).observe(timing.first_token - timing.arrival)
        for gap in timing.itls:
            self.itl.labels(m).observe(gap)
        self.e2e.labels(m).observe(time.monotonic() - timing.arrival)

    def on_stats(self, stats: Any) -> None:
        m = self.model_name
        self.running.labels(m).set(stats.num_running_reqs)
        self.waiting.labels(m).set(stats.num_waiting_reqs)
        self.kv_usage.labels(m).set(stats.kv_cache_usage)
        self.prefix_queries.labels(m).set(stats.prefix_cache_queries)
        self.prefix_hits.labels(m).set(stats.prefix_cache_hits)
        rate = stats.prefix_cache_hits / stats.prefix_cache_queries if stats.prefix_cache_queries else 0.0
        self.prefix_hit_rate.labels(m).set(rate)
        self.preemptions.labels(m).set(stats.num_preemptions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
