"""Mixture-of-experts architectures (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) against Hugging Face
transformers on tiny random checkpoints: logits of one dense forward, then the whole engine
(paged attention, prefix caching, chunked prefill) with greedy tokens and their logprobs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers import MOE_CASES as CASES
from helpers import assert_engine_matches_hf, hf_model, random_ids, tiny_moe
from host import LLM
from host.core.config import LoadConfig, ModelConfig
from host.core.models.loader import load_model
from host.core.moe.layer import FusedMoE

VOCAB = 256


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, Any]]:
    made = {}
    for case in CASES:
        path = tiny_moe(tmp_path_factory.mktemp(case), case)
        made[case] = (path, hf_model(path))
    return made


def _ids(n: int, seed: int) -> torch.Tensor:
    return random_ids(n, seed, VOCAB)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(checkpoints, case: str) -> None:
    path, hf = checkpoints[case]
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == CASES[case][0] + "ForCausalLM"
    sparse = [isinstance(getattr(layer.mlp, "experts", None), FusedMoE) for layer in model.model.layers]
    assert sparse == ([True, False, True] if case == "qwen2_moe" else [True] * 3)
    ids = _ids(40, seed=1)
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(len(ids))))
        ref = hf(ids[None]).logits[0].float()
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-4, f"{case}: max |logit diff| = {diff}"


@pytest.mark.parametrize("case", list(CASES))
def test_engine_greedy_and_logprobs_match_transformers(checkpoints, case: str) -> None:
    path, hf = checkpoints[case]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=96, block_size=8, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, enable_chunked_prefill=True)
    assert_engine_matches_hf(llm, hf, VOCAB)
