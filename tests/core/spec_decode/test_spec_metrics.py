"""Speculative decoding's metrics: the Prometheus counters (vLLM's names) advance by the
engine's totals, the log line shows the interval's acceptance, and the engine's totals count
what its steps verified."""

from __future__ import annotations

import types

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from host.contracts.messages import SchedulerStats, SpecDecodingStats
from host.core.config import SpeculativeConfig
from host.plugins.stat_loggers.logging_logger import LoggingStatLogger
from host.plugins.stat_loggers.prometheus import PrometheusStatLogger
from host.sdk.stat_logger import StatLoggerContext


def _samples(registry) -> dict:
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {(s.name, s.labels.get("position")): s.value for f in families for s in f.samples}


def test_prometheus_spec_decode_counters():
    config = types.SimpleNamespace(model=None, cache=None, speculative=SpeculativeConfig())
    registry = CollectorRegistry()
    exporter = PrometheusStatLogger(StatLoggerContext(config=config, model_name="m", metrics_prefix="vllm", registry=registry))
    for totals in ({"num_drafts": 3, "num_draft_tokens": 12, "num_accepted_tokens": 7, "num_accepted_tokens_per_pos": [3, 2, 1, 1]},
                   {"num_drafts": 5, "num_draft_tokens": 20, "num_accepted_tokens": 9, "num_accepted_tokens_per_pos": [4, 3, 1, 1]}):
        exporter.record(SchedulerStats(spec_decoding=SpecDecodingStats(**totals)), None)
    value = _samples(registry)
    assert value[("vllm:spec_decode_num_drafts_total", None)] == 5
    assert value[("vllm:spec_decode_num_draft_tokens_total", None)] == 20
    assert value[("vllm:spec_decode_num_accepted_tokens_total", None)] == 9
    assert [value[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(p))] for p in range(4)] == [4, 3, 1, 1]
    plain = CollectorRegistry()
    PrometheusStatLogger(StatLoggerContext(config=types.SimpleNamespace(model=None, cache=None), metrics_prefix="host", registry=plain))
    assert not [name for name, _ in _samples(plain) if "spec_decode" in name]


def test_log_line_shows_the_intervals_acceptance():
    lg = LoggingStatLogger(StatLoggerContext())
    lg.record(SchedulerStats(spec_decoding=SpecDecodingStats(**{"num_drafts": 4, "num_draft_tokens": 16, "num_accepted_tokens": 8})), None)
    text, _ = lg.line(now=lg.last_log + 1.0)
    assert text.endswith(", Spec decode: acceptance rate 50.0%, mean accepted length 3.00, drafts 4")
    lg.record(SchedulerStats(spec_decoding=SpecDecodingStats(**{"num_drafts": 6, "num_draft_tokens": 24, "num_accepted_tokens": 10})), None)
    text, _ = lg.line(now=lg.last_log + 1.0)
    assert text.endswith(", Spec decode: acceptance rate 25.0%, mean accepted length 2.00, drafts 2")
    text, _ = lg.line(now=lg.last_log + 1.0)  # no drafts in the interval: no spec part
    assert "Spec decode" not in text
    lg2 = LoggingStatLogger(StatLoggerContext())
    lg2.record(SchedulerStats(), None)
    assert "Spec decode" not in lg2.line()[0]


def test_bench_serve_reports_the_runs_spec_counters():
    """``host bench serve`` reads the spec counters from a real exporter's /metrics page,
    before and after the run."""
    from host.core.entrypoints.cli.bench_cmd import spec_decode_counters, spec_decode_report

    config = types.SimpleNamespace(model=None, cache=None, speculative=SpeculativeConfig())
    registry = CollectorRegistry()
    exporter = PrometheusStatLogger(StatLoggerContext(config=config, model_name="m", metrics_prefix="host", registry=registry))
    exporter.record(SchedulerStats(spec_decoding=SpecDecodingStats(**{"num_drafts": 2, "num_draft_tokens": 8, "num_accepted_tokens": 4,
                                                  "num_accepted_tokens_per_pos": [2, 1, 1, 0]})), None)
    before = spec_decode_counters(generate_latest(registry).decode())
    exporter.record(SchedulerStats(spec_decoding=SpecDecodingStats(**{"num_drafts": 12, "num_draft_tokens": 48, "num_accepted_tokens": 34,
                                                  "num_accepted_tokens_per_pos": [12, 10, 7, 5]})), None)
    report = spec_decode_report(before, spec_decode_counters(generate_latest(registry).decode()))
    assert report == {"num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 30, "accepted_per_pos": [10, 9, 6, 5],
                      "acceptance_rate": 0.75, "mean_accepted_length": 4.0}
    plain = CollectorRegistry()
    PrometheusStatLogger(StatLoggerContext(config=types.SimpleNamespace(model=None, cache=None), metrics_prefix="host", registry=plain))
    assert spec_decode_counters(generate_latest(plain).decode()) is None
