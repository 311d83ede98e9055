"""``-dp N`` below the server: the per-engine config copies, the summed ``stats`` answer, one set
of stat loggers per engine whose Prometheus series share each family under their own ``engine``
label, and the offline ``LLM(data_parallel_size=2)`` (:class:`DPSyncMPClient`) against
transformers. The server's client (streams, aborts, engine death) is tested through a real
``host serve -dp 2`` in tests/plugins/endpoints/test_data_parallel.py."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.contracts.messages import EngineCoreOutputs, SchedulerStats, encoder, from_engine_decoder
from host.core.engine.dp_client import UTILITY_POLICY, engine_config, sum_stats
from host.core.engine_args import EngineArgs
from host.core.frontend.stat_loggers import StatLoggerManager
from host.plugins.stat_loggers import LoggingStatLogger, PrometheusStatLogger
from host.sdk.stat_logger import StatLoggerContext


@pytest.fixture(scope="module")
def dp_config(tiny_checkpoint):
    path = tiny_checkpoint("llama", weights=False)
    return EngineArgs(model=str(path), skip_tokenizer_init=True, max_model_len=64, data_parallel_size=2).create_engine_config()


def test_each_engine_gets_its_own_parallel_config(dp_config):
    copies = [engine_config(dp_config, rank) for rank in range(2)]
    assert [c.parallel.data_parallel_rank for c in copies] == [0, 1]
    assert dp_config.parallel.data_parallel_rank == 0  # the original is left as it was
    assert all(c.parallel is not dp_config.parallel and c.model is dp_config.model for c in copies)
    assert all(c.parallel.data_parallel_size == 2 and c.parallel.distributed_init_method is None for c in copies)


def test_engine_index_travels_on_the_wire():
    msg = from_engine_decoder.decode(encoder.encode(EngineCoreOutputs(heartbeat=True, engine_index=3)))
    assert msg.engine_index == 3
    assert from_engine_decoder.decode(encoder.encode(EngineCoreOutputs())).engine_index == 0


def test_stats_of_every_engine_are_summed():
    a = SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.5, prefix_cache_queries=10,
                       prefix_cache_hits=5, num_preemptions=1)
    b = {"num_running_reqs": 1, "kv_cache_usage": 0.1, "prefix_cache_queries": 30, "prefix_cache_hits": 3}  # as the wire gives it
    out = UTILITY_POLICY["stats"]([a, b])
    assert out["num_running_reqs"] == 3 and out["num_waiting_reqs"] == 1 and out["num_preemptions"] == 1
    assert out["kv_cache_usage"] == pytest.approx(0.3)
    assert out["prefix_cache_hit_rate"] == pytest.approx(8 / 40)
    assert sum_stats([])["prefix_cache_hit_rate"] == 0.0
    assert UTILITY_POLICY["reset_prefix_cache"]([True, True]) is True
    assert UTILITY_POLICY["reset_prefix_cache"]([True, False]) is False  # one engine still had blocks in use


def test_one_logger_set_per_engine_each_fed_its_own_steps(dp_config):
    registry = CollectorRegistry()
    context = StatLoggerContext(config=dp_config, model_name="m", registry=registry, engine_info={"num_gpu_blocks": 7})
    loggers = {"prometheus": PrometheusStatLogger, "logging": LoggingStatLogger}
    manager = StatLoggerManager.create(loggers, context)
    assert [[lg.engine_index for lg in group] for group in manager.per_engine] == [[0, 0], [1, 1]]
    manager._each("log_engine_initialized")  # both engines' cache_config_info in one family
    manager.on_step(SchedulerStats(num_running_reqs=3, prefix_cache_queries=8, prefix_cache_hits=4), None, engine_index=1)
    manager.on_step(SchedulerStats(num_running_reqs=1, prefix_cache_queries=2), None, engine_index=0)
    manager.on_step(SchedulerStats(num_running_reqs=2, prefix_cache_queries=10, prefix_cache_hits=4), None, engine_index=1)
    samples = {
        (s.name, s.labels.get("engine")): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
    }
    assert samples[("vllm:num_requests_running", "0")] == 1 and samples[("vllm:num_requests_running", "1")] == 2
    # each engine's totals are differenced against its own previous snapshot
    assert samples[("vllm:prefix_cache_queries_total", "1")] == 10
    assert samples[("vllm:prefix_cache_queries_total", "0")] == 2
    assert samples[("vllm:cache_config_info", "0")] == 1 and samples[("vllm:cache_config_info", "1")] == 1


def test_offline_llm_with_two_engines_matches_transformers(tiny_checkpoint):
    """``LLM(data_parallel_size=2)``: two engine processes (no C++ kernels: -O0, torch_paged), the
    prompts split between them, every result transformers' greedy tokens."""
    path = tiny_checkpoint("llama")
    prompts = [[(7 * i + 3 * j) % 300 for j in range(3 + i % 5)] for i in range(6)]
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=64, data_parallel_size=2, optimization_level=0,
              attention_backend="torch_paged")
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        per_engine = [engine.utility("stats") for engine in llm.engine_core.engines]
        total = llm.stats()
        pids = llm.engine_core.engine_info["engine_pids"]
        assert llm.engine_core.load() == [0, 0]  # every request released when it finished
    finally:
        llm.shutdown()
    model = hf_model(path)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(model, p, 6) for p in prompts]
    assert len(set(pids)) == 2
    queried = [s["prefix_cache_queries"] for s in per_engine]  # prompt tokens each engine looked up
    assert min(queried) > 0 and total.prefix_cache_queries == sum(queried)
