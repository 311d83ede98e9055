"""``LLM(..., multiprocess=True)``: the engine core in its own process, like ``host serve``.

The same front end (input processor, output processor) drives a spawned engine-core process
over ZMQ; greedy tokens must equal Hugging Face transformers' and the in-process engine's,
bad input must fail in the front end or come back as a clear error, and shutting down must
leave no engine process behind.
"""

from __future__ import annotations

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.contracts.messages import encoder
from host.core.engine.client import EngineDeadError, SyncMPClient

PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [11, 12, 13], list(range(20, 60))]
NEW = 10


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def mp_llm(checkpoint):
    # 8 blocks of 16 tokens: 7 usable (one is the null block), 112 tokens
    llm = LLM(str(checkpoint), multiprocess=True, skip_tokenizer_init=True, num_gpu_blocks_override=8, block_size=16)
    yield llm
    llm.shutdown()


def test_multiprocess_greedy_equals_transformers_and_in_process(mp_llm, checkpoint):
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    outs = mp_llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    model = hf_model(checkpoint)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(model, prompt, NEW)
        assert out.outputs[0].finish_reason == "length"
    local = LLM(str(checkpoint), skip_tokenizer_init=True, num_gpu_blocks_override=8, block_size=16)
    try:
        same = local.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        assert [o.outputs[0].token_ids for o in same] == [o.outputs[0].token_ids for o in outs]
    finally:
        local.shutdown()


def test_multiprocess_n_logprobs_and_stats(mp_llm):
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=3, logprobs=2, ignore_eos=True)
    (out,) = mp_llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    for comp in out.outputs:
        assert len(comp.token_ids) == 6 and len(comp.logprobs) == 6
        assert all(tok in pos for tok, pos in zip(comp.token_ids, comp.logprobs))
    stats = mp_llm.stats()
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0 and stats.kv_cache_usage == 0.0
    with pytest.raises(AttributeError, match="multiprocess=True"):
        mp_llm.engine  # noqa: B018 - the in-process EngineCore is not reachable


def test_multiprocess_bad_input_fails_only_that_call(mp_llm):
    with pytest.raises(ValueError, match="out of vocabulary"):
        mp_llm.generate([{"prompt_token_ids": [1, 2, 100000]}])
    with pytest.raises(ValueError, match="temperature"):
        mp_llm.generate([{"prompt_token_ids": [1, 2]}], SamplingParams(temperature=-1.0))
    # refused by the engine process itself: within max_model_len (128), larger than the KV cache
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        mp_llm.generate([{"prompt_token_ids": [7] * 120}], SamplingParams(max_tokens=1))
    # a message the engine process cannot decode fails that request, not the process
    client = mp_llm.engine_core
    client._to_engine.send(encoder.encode(
        {"type": "add", "request_id": "bad", "prompt_token_ids": [1], "sampling_params": {"top_p": 7.0}}
    ))
    outputs = []
    while not outputs:  # a step that finished nothing (stats only) may come first
        outputs = client.get_output().outputs
    (refused,) = outputs
    assert refused.req_id == "bad" and refused.finish_reason == "abort" and "top_p" in refused.error
    # the engine process is still serving, and nothing leaked
    (out,) = mp_llm.generate([{"prompt_token_ids": PROMPTS[1]}], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 3
    assert mp_llm.stats().kv_cache_usage == 0.0


def test_multiprocess_stream_and_early_close_frees_blocks(mp_llm):
    stream = mp_llm.stream({"prompt_token_ids": PROMPTS[2]}, SamplingParams(max_tokens=50, ignore_eos=True))
    first = next(stream)
    assert 1 <= len(first.outputs[0].token_ids) < 50
    stream.close()  # the consumer stops early: the request is aborted in the engine process
    (out,) = mp_llm.generate([{"prompt_token_ids": PROMPTS[1]}], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 2
    assert mp_llm.stats().kv_cache_usage == 0.0


def test_dead_engine_process_fails_fast_and_shutdown_leaves_no_process(checkpoint):
    llm = LLM(str(checkpoint), multiprocess=True, skip_tokenizer_init=True, num_gpu_blocks_override=32)
    client = llm.engine_core
    assert isinstance(client, SyncMPClient)
    process = client._proc.process
    process.kill()
    process.join(10)
    with pytest.raises(EngineDeadError, match="engine process died"):
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=4))
    llm.shutdown()
    assert not process.is_alive()

    llm = LLM(str(checkpoint), multiprocess=True, skip_tokenizer_init=True, num_gpu_blocks_override=32)
    process = llm.engine_core._proc.process
    llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=2))
    llm.shutdown()
    assert not process.is_alive() and process.exitcode == 0
