"""The built-in stat loggers on their own: the Prometheus exporter's names, labels and buckets,
the periodic log line, and the JSON-lines sink."""

from __future__ import annotations

import json
import logging
import types

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from host.contracts.messages import SchedulerStats
from host.plugins.stat_loggers.jsonl import JsonlStatLogger
from host.plugins.stat_loggers.logging_logger import LoggingStatLogger
from host.plugins.stat_loggers.prometheus import PrometheusStatLogger, build_1_2_5_buckets
from host.sdk.stat_logger import FinishedRequestStats, IterationStats, StatLoggerContext


def _finished(**kw) -> FinishedRequestStats:
    base = dict(request_id="r", finish_reasons=["stop", "length"], num_prompt_tokens=12, num_generation_tokens=9,
                max_num_generation_tokens=5, num_cached_tokens=4, n=2, max_tokens=5, e2e_latency=0.9,
                queued_time=0.1, prefill_time=0.2, decode_time=0.6, inference_time=0.8,
                mean_time_per_output_token=0.15, num_preemptions=1)
    return FinishedRequestStats(**{**base, **kw})


def _families(registry) -> dict:
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_build_1_2_5_buckets():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(1024)[-1] == 1000


def test_prometheus_exporter_names_labels_and_buckets():
    config = types.SimpleNamespace(model=types.SimpleNamespace(max_model_len=1024), cache=None)
    registry = CollectorRegistry()
    ctx = StatLoggerContext(config=config, model_name="m", metrics_prefix="vllm", registry=registry)
    exporter = PrometheusStatLogger(ctx)
    it = IterationStats(timestamp=0.0, num_prompt_tokens=12, num_generation_tokens=2, time_to_first_tokens=[0.03],
                        inter_token_latencies=[0.02, 0.04], num_preemptions=1, prefix_cache_queries=12,
                        prefix_cache_hits=4, finished_requests=[_finished()], num_requests_in_flight=1)
    exporter.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, num_waiting_deferred=1, kv_cache_usage=0.25,
                                   prefix_cache_queries=12, prefix_cache_hits=4), it)
    fam = _families(registry)
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fam.values() for s in f.samples}
    lab = (("engine", "0"), ("model_name", "m"))
    assert value[("vllm:num_requests_running", lab)] == 3
    assert value[("vllm:num_requests_waiting_by_reason", tuple(sorted(lab + (("reason", "capacity"),))))] == 1
    assert value[("vllm:num_requests_waiting_by_reason", tuple(sorted(lab + (("reason", "deferred"),))))] == 1
    assert value[("vllm:kv_cache_usage_perc", lab)] == 0.25
    assert value[("vllm:prefix_cache_queries_total", lab)] == 12
    assert value[("vllm:prompt_tokens_total", lab)] == 12
    assert value[("vllm:num_preemptions_total", lab)] == 1
    for reason, count in (("stop", 1), ("length", 1), ("abort", 0)):
        assert value[("vllm:request_success_total", tuple(sorted(lab + (("finished_reason", reason),))))] == count
    assert value[("vllm:inter_token_latency_seconds_count", lab)] == 2
    assert value[("vllm:request_prefill_kv_computed_tokens_sum", lab)] == 8
    assert value[("vllm:iteration_tokens_total_sum", lab)] == 14

    def edges(name: str) -> list[float]:
        return [float(s.labels["le"]) for s in fam[name].samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]

    assert edges("vllm:time_to_first_token_seconds")[:3] == [0.001, 0.005, 0.01] and edges("vllm:time_to_first_token_seconds")[-1] == 2560.0
    assert edges("vllm:inter_token_latency_seconds")[-1] == 80.0 and len(edges("vllm:inter_token_latency_seconds")) == 19
    assert edges("vllm:e2e_request_latency_seconds")[0] == 0.3 and edges("vllm:e2e_request_latency_seconds")[-1] == 7680.0
    assert edges("vllm:request_params_n") == [1, 2, 5, 10, 20]
    assert edges("vllm:request_num_preemptions") == [1, 2, 3, 4, 5, 10, 20]
    assert edges("vllm:request_prompt_tokens") == [float(b) for b in build_1_2_5_buckets(1024)]
    assert edges("vllm:iteration_tokens_total")[-1] == 16384


def test_prometheus_counts_the_kv_connectors_totals_and_computed_prompt_tokens():
    """The engine sends totals; the counters advance by the difference (only with a connector)."""
    config = types.SimpleNamespace(model=types.SimpleNamespace(max_model_len=1024), cache=None, kv_transfer=object())
    registry = CollectorRegistry()
    exporter = PrometheusStatLogger(StatLoggerContext(config=config, model_name="m", metrics_prefix="host", registry=registry))
    for totals, computed in (({"external_hit_tokens": 32, "load_bytes": 4096}, 5),
                             ({"external_hit_tokens": 48, "load_bytes": 4096, "failed_loads": 1, "my_own": 2}, 9)):
        exporter.record(SchedulerStats(num_prompt_tokens_computed=computed, kv_connector_stats=totals), None)
    value = {(s.name, s.labels.get("stat")): s.value for f in _families(registry).values() for s in f.samples}
    assert value[("host:kv_connector_external_hit_tokens_total", None)] == 48
    assert value[("host:kv_connector_load_bytes_total", None)] == 4096
    assert value[("host:kv_connector_failed_loads_total", None)] == 1
    assert value[("host:kv_connector_failed_transfers_total", None)] == 0
    assert value[("host:kv_connector_other_total", "my_own")] == 2
    assert value[("host:prompt_tokens_computed_total", None)] == 9
    plain = CollectorRegistry()
    PrometheusStatLogger(StatLoggerContext(config=types.SimpleNamespace(model=None, cache=None), metrics_prefix="host", registry=plain))
    assert not [n for n in _families(plain) if "kv_connector" in n]


def test_prometheus_prefix_must_be_a_metric_name():
    with pytest.raises(ValueError, match="metrics prefix 'my-prefix' is not a Prometheus name"):
        PrometheusStatLogger(StatLoggerContext(metrics_prefix="my-prefix"))


def test_logging_line_reports_throughput_and_quiets_when_idle(caplog):
    lg = LoggingStatLogger(StatLoggerContext())
    lg.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.5),
              IterationStats(timestamp=0.0, num_prompt_tokens=100, num_generation_tokens=50,
                             prefix_cache_queries=100, prefix_cache_hits=25))
    text, busy = lg.line(now=lg.last_log + 10.0)
    assert busy
    assert text == ("Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
                    "Running: 2 reqs, Waiting: 1 reqs, KV cache usage: 50.0%, Prefix cache hit rate: 25.0%")
    lg.record(SchedulerStats(), None)
    with caplog.at_level(logging.DEBUG, logger="host.stats"):
        lg._was_busy = True
        lg.log()  # the first idle interval after traffic is still INFO
        lg.log()
    assert [r.levelno for r in caplog.records if r.name == "host.stats"] == [logging.INFO, logging.DEBUG]


def test_jsonl_sink_writes_one_line_per_record(tmp_path):
    path = tmp_path / "stats.jsonl"
    sink = JsonlStatLogger(StatLoggerContext(), str(path))
    sink.record(SchedulerStats(num_running_reqs=1), IterationStats(timestamp=1.0, num_generation_tokens=3, finished_requests=[_finished()]))
    sink.record(None, IterationStats(timestamp=2.0))
    lines = [json.loads(x) for x in path.read_text().splitlines()]  # on disk before shutdown
    sink.shutdown()
    assert lines[0]["scheduler"]["num_running_reqs"] == 1
    assert lines[0]["iteration"]["finished_requests"][0]["finish_reasons"] == ["stop", "length"]
    assert lines[1]["scheduler"] is None and lines[1]["iteration"]["num_generation_tokens"] == 0
    with pytest.raises(ValueError, match="needs a file: write --stat-loggers jsonl:PATH"):
        JsonlStatLogger(StatLoggerContext(), None)
    with pytest.raises(ValueError, match="cannot open .* for appending"):
        JsonlStatLogger(StatLoggerContext(), str(tmp_path / "no" / "such" / "dir" / "x.jsonl"))


def test_prometheus_shows_the_eplb_balancedness_and_rearrangements():
    """--enable-eplb: the balancedness gauge follows the last report, the counters advance by the
    totals' differences; without EPLB the families do not exist."""
    from host.contracts.messages import EPLBStats

    config = types.SimpleNamespace(model=types.SimpleNamespace(max_model_len=1024), cache=None,
                                   parallel=types.SimpleNamespace(enable_eplb=True))
    registry = CollectorRegistry()
    exporter = PrometheusStatLogger(StatLoggerContext(config=config, model_name="m", metrics_prefix="vllm", registry=registry))
    exporter.record(SchedulerStats(eplb_stats=EPLBStats()), None)  # before the first window: no value yet
    for report in (EPLBStats(balancedness=0.62, rearrangements=1, skipped=0), EPLBStats(balancedness=0.91, rearrangements=2, skipped=3)):
        exporter.record(SchedulerStats(eplb_stats=report), None)
    value = {s.name: s.value for f in _families(registry).values() for s in f.samples}
    assert value["vllm:eplb_balancedness"] == pytest.approx(0.91)
    assert value["vllm:eplb_rearrangements_total"] == 2 and value["vllm:eplb_rearrangements_skipped_total"] == 3
    plain = CollectorRegistry()
    PrometheusStatLogger(StatLoggerContext(config=types.SimpleNamespace(model=None, cache=None), metrics_prefix="vllm", registry=plain))
    assert not [n for n in _families(plain) if "eplb" in n]
