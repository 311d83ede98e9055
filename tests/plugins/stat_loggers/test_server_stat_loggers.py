"""Stat loggers through a real ``host serve``: by default the /metrics families are vLLM's
(``vllm:``, diffed against the list below; ``--metrics-prefix host`` gives ``host:``), the JSON-lines sink and a third-party logger
installed with pip receive the records, and the periodic log line appears."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import run_server

# every family host exports by default (--metrics-prefix vllm), and its type (vLLM's names and types)
VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
}
HOST_OWN = {"vllm:prefix_cache_hit_rate": "gauge", "vllm:num_requests_in_flight": "gauge", "vllm:model_weights_bytes": "gauge",
            "vllm:prompt_tokens_computed": "counter"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, fixture_sites):
    tmp = tmp_path_factory.mktemp("stat-loggers")
    jsonl, sink = tmp / "stats.jsonl", tmp / "fixture.jsonl"
    args = ["--log-stats-interval", "1", "--plugins", "fixture_statsink",
            "--stat-loggers", f"jsonl:{jsonl}", "--stat-loggers", f"fixture_stats:{sink}"]
    with run_server(tmp, args, sites=[fixture_sites["statsink"]]) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        client.completions.create(model="", prompt="Count: one, two, three,", max_tokens=6, temperature=0, n=2)
        client.completions.create(model="", prompt="Hello", max_tokens=4, temperature=0, stop=["\n"])
        time.sleep(1.5)  # one log interval
        yield server, jsonl, sink


def _families(server) -> dict:
    text = httpx.get(f"{server.url}/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metric_families_are_vllms(served):
    server, _, _ = served
    fams = _families(server)
    # prometheus_client writes each counter's and histogram's creation time as a *_created
    # gauge family (vLLM's /metrics has them too)
    ours = {name: f.type for name, f in fams.items() if name.startswith("vllm:") and not name.endswith("_created")}
    assert ours == {**VLLM_FAMILIES, **HOST_OWN}
    assert not [n for n in fams if n.startswith("host:")]
    assert "process_resident_memory_bytes" in fams
    for name in VLLM_FAMILIES:
        for sample in fams[name].samples:
            if name == "vllm:cache_config_info":
                assert {"engine", "block_size", "num_gpu_blocks"} <= set(sample.labels)
            else:
                assert sample.labels["model_name"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and sample.labels["engine"] == "0", (name, sample)
    value = {(s.name, s.labels.get("finished_reason")): s.value for f in fams.values() for s in f.samples}
    assert value[("vllm:request_success_total", "length")] >= 2  # the two samples of n=2
    assert value[("vllm:request_params_n_count", None)] == 2
    assert value[("vllm:request_params_n_sum", None)] == 3
    assert value[("vllm:generation_tokens_total", None)] >= 13
    assert value[("vllm:num_requests_running", None)] == 0
    # the phases come from the engine's events: they were measured, not left at 0
    for phase in ("queue_time", "prefill_time", "decode_time", "inference_time"):
        assert value[(f"vllm:request_{phase}_seconds_count", None)] == 2
    assert value[("vllm:request_prefill_time_seconds_sum", None)] > 0
    assert value[("vllm:request_decode_time_seconds_sum", None)] > 0
    assert value[("vllm:time_to_first_token_seconds_count", None)] == 2
    assert value[("vllm:inter_token_latency_seconds_count", None)] > 0


def test_jsonl_sink_and_the_pip_installed_logger_receive_records(served):
    server, jsonl, sink = served
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert lines and all(set(x) == {"time", "engine", "scheduler", "iteration"} for x in lines)
    finished = [r for x in lines for r in x["iteration"]["finished_requests"]]
    assert sorted(r["n"] for r in finished) == [1, 2]
    assert sum(x["iteration"]["num_generation_tokens"] for x in lines) >= 13

    events = [json.loads(x) for x in sink.read_text().splitlines()]
    kinds = {e["event"] for e in events}
    assert {"engine_initialized", "record", "log"} <= kinds
    assert next(e for e in events if e["event"] == "engine_initialized")["num_gpu_blocks"] > 0
    fin = [f for e in events if e["event"] == "record" for f in e["finished"]]
    assert sorted(f["n"] for f in fin) == [1, 2]
    two = next(f for f in fin if f["n"] == 2)
    assert two["reasons"] == ["length", "length"] and two["generated"] == 12 and two["max_tokens"] == 6
    assert two["e2e"] >= two["decode"] > 0 and two["prefill"] > 0


def test_the_periodic_log_line(served):
    server, _, _ = served
    assert "Avg prompt throughput:" in server.log() and "Prefix cache hit rate:" in server.log()


def test_unknown_stat_logger_fails_before_the_engine_starts(tmp_path):
    from helpers import run_host

    proc = run_host(["serve", "--stat-loggers", "nosuch:1", "--port", "1"], [], timeout=120)
    assert proc.returncode == 2
    assert "unknown stat logger(s) 'nosuch'" in proc.stderr and "registered: jsonl, logging, prometheus" in proc.stderr


def test_disable_log_stats_and_the_host_prefix(flags_server):
    """On the session's ``flags_server`` (tests/conftest.py: ``--disable-log-stats
    --log-stats-interval 0.5 --metrics-prefix host``): host's own names, the same families."""
    server = flags_server
    args = server.proc.args
    assert "--disable-log-stats" in args and args[args.index("--log-stats-interval") + 1] == "0.5"
    assert args[args.index("--metrics-prefix") + 1] == "host"
    openai.OpenAI(base_url=f"{server.url}/v1", api_key="x").completions.create(model="", prompt="Hi", max_tokens=3)
    time.sleep(1.0)  # two log intervals
    fams = _families(server)
    assert {name.replace("vllm:", "host:", 1) for name in VLLM_FAMILIES} <= set(fams)
    assert not [n for n in fams if n.startswith("vllm:")]
    assert "Avg prompt throughput:" not in server.log()  # never, since its start
