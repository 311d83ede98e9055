"""``-O`` levels on the CPU platform, each against transformers' greedy tokens: -O0 (eager
torch), -O2 (the default: hand-written kernels) and -O3 (``torch.compile`` with attention as the
opaque ``host::attention`` op)."""

from __future__ import annotations

import random

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", tie_word_embeddings=True)
    return str(path), hf_model(path)


@pytest.mark.parametrize("level", [0, 2, 3])
def test_levels_match_transformers(tiny, level):
    path, hf = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, optimization_level=level, max_num_batched_tokens=16, max_num_seqs=4)
    runner = llm.engine.executor.worker.model_runner
    model = runner.model
    if level == 0:
        assert model.model.norm.kernel is None and model.model.decode_kernel is None
    elif level == 2:
        assert model.model.norm.kernel is not None and model.model.decode_kernel is not None
    else:
        assert runner._forward is not model, "-O3 compiles the forward"
        assert all(layer.opaque for layer in runner._attention_layers.values())
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 19, 1, 9)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 6)


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="optimization_level=5"):
        LLM(skip_tokenizer_init=True, optimization_level=5)
