"""Pipeline parallelism end to end: ``-pp 2`` (and ``-tp 2 -pp 2``) through the mp executor's
worker processes, against the one-process engine (``tp=1, pp=1``) and transformers.

A stage runs its own layers and hands the hidden states and residual to the next with gloo
send/recv; only the last stage samples; the engine keeps ``pp`` steps in flight (the batch
queue). Splitting the layers changes no arithmetic, so greedy tokens must be identical and fp32
logprobs within 1e-4 (1e-4 also covers the tensor-parallel sums of the tp x pp run), with prefix
caching and chunked prefill on and more requests than one step takes.
"""

from __future__ import annotations

import random

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.contracts.request import Request

ENGINE = dict(skip_tokenizer_init=True, max_model_len=64, max_num_batched_tokens=24, max_num_seqs=8, block_size=4)
NEW = 8


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 300) for _ in range(12)]  # shared: prefix-cache hits
    return [prefix + [rng.randrange(3, 300) for _ in range(n)] for n in (5, 28, 2, 17, 40, 9, 3, 21)]


PROMPTS = _prompts(1)
PARAMS = [
    SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, logprobs=3),
    SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=2),
    SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, presence_penalty=1.5, frequency_penalty=0.5),
    SamplingParams(max_tokens=NEW, temperature=0.9, ignore_eos=True, seed=7),
    SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, min_tokens=4, repetition_penalty=1.3),
    SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=3),
    SamplingParams(max_tokens=NEW, temperature=0.8, top_k=20, ignore_eos=True, seed=3),
    SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, logprobs=3),
]


def _run(llm: LLM) -> list:
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)


def _assert_same(got: list, want: list, tol: float = 1e-4) -> None:
    for g, w in zip(got, want):
        g, w = g.outputs[0], w.outputs[0]
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        for a, b in zip(g.logprobs or [], w.logprobs or []):
            assert sorted(a) == sorted(b) and all(abs(a[t].logprob - b[t].logprob) < tol for t in a)
    for g, w in zip(got, want):
        assert len(g.prompt_logprobs or []) == len(w.prompt_logprobs or [])
        for a, b in zip(g.prompt_logprobs or [], w.prompt_logprobs or []):
            assert (a is None) == (b is None)
            if a is not None:
                assert all(abs(a[t].logprob - b[t].logprob) < tol for t in set(a) & set(b))


def _started(path: str, **kw) -> LLM:
    return LLM(path, distributed_executor_backend="mp", **ENGINE, **kw)


def _stop(llm: LLM) -> None:
    workers = list(llm.engine.executor.workers)
    llm.shutdown()
    assert all(not p.is_alive() for p in workers), "a worker process outlived the engine"


@pytest.fixture(scope="module")
def llama(tiny_checkpoint):
    """4 layers, GQA (4 heads, 2 KV heads), tied embeddings (the last stage holds them too)."""
    path = str(tiny_checkpoint("llama", num_hidden_layers=4, initializer_range=0.1, tie_word_embeddings=True))
    ref = LLM(path, **ENGINE)
    try:
        yield path, _run(ref), hf_model(path)
    finally:
        ref.shutdown()


def test_pp2_equals_one_process_and_transformers(llama):
    path, want, hf = llama
    llm = _started(path, pipeline_parallel_size=2)
    try:
        engine = llm.engine
        assert engine.executor.max_concurrent_batches == 2 and engine.batch_queue.depth == 2
        got = _run(llm)
        _assert_same(got, want)
        greedy = [i for i, sp in enumerate(PARAMS) if sp.temperature == 0 and not sp.presence_penalty
                  and not sp.min_tokens]
        for i in greedy:
            assert got[i].outputs[0].token_ids == hf_greedy(hf, PROMPTS[i], PARAMS[i].max_tokens)
        assert engine.scheduler.make_stats().prefix_cache_hits > 0
        # each stage holds the KV cache of its own two layers only
        kv = engine.executor.collective_rpc("get_kv_cache_specs")
        assert [len(specs) for specs in kv] == [2, 2]
        # two steps in the pipeline at once, split evenly, never sharing a request
        for i, p in enumerate(PROMPTS[:4]):
            engine.add_request(Request(f"fill{i}", p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)))
        tokens: dict[str, list[int]] = {f"fill{i}": [] for i in range(4)}
        both = 0
        while engine.has_unfinished_requests():
            for out in engine.step().outputs:
                tokens[out.req_id] += out.new_token_ids
            queued = [set(so.num_scheduled_tokens) for so, _ in engine.batch_queue._steps]
            both += len(queued) == 1 and len(queued[0]) == 2  # the other half was just handed back
        assert both >= 2
        assert all(tokens[f"fill{i}"] == hf_greedy(hf, PROMPTS[i], 4) for i in range(4))
    finally:
        _stop(llm)


@pytest.mark.slow  # four worker processes on two cores (over 20 s); `make test` still runs it
def test_tp2_pp2_uneven_partition_on_qwen3(tiny_checkpoint):
    """Four processes (tp 2 in each of 2 stages), a 3 + 1 layer split, Qwen3 (q/k norms, GQA,
    untied LM head on the last stage)."""
    path = str(tiny_checkpoint("qwen3", num_hidden_layers=4, initializer_range=0.1, head_dim=16))
    ref = LLM(path, **ENGINE)
    try:
        want = _run(ref)
    finally:
        ref.shutdown()
    llm = _started(path, tensor_parallel_size=2, pipeline_parallel_size=2, pp_layer_partition=[3, 1])
    try:
        assert len(llm.engine.executor.workers) == 4 and llm.engine.executor.output_rank == 2
        _assert_same(_run(llm), want)
        kv = llm.engine.executor.collective_rpc("get_kv_cache_specs")
        assert [len(specs) for specs in kv] == [3, 3, 1, 1]
        assert all(spec.num_kv_heads == 1 for specs in kv for spec in specs)  # 2 KV heads over tp 2
    finally:
        _stop(llm)


@pytest.mark.parametrize("partition", [[2, 3], [4, 0], [1, 1, 2]])
def test_a_partition_that_does_not_fit_is_a_value_error(llama, partition):
    with pytest.raises(ValueError, match="pp-layer-partition"):
        _started(llama[0], pipeline_parallel_size=2, pp_layer_partition=partition)
