"""Mixture-of-experts architectures (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) against Hugging Face
transformers on tiny random checkpoints: logits of one dense forward, then the whole engine
(paged attention, prefix caching, chunked prefill) with greedy tokens and their logprobs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from helpers import hf_model
from host import LLM, SamplingParams
from host.core.config import LoadConfig, ModelConfig
from host.core.models.loader import load_model
from host.core.moe.layer import FusedMoE

VOCAB = 256
BASE = dict(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
    max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=False,
)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # layer 1 dense (mlp_only_layers), shared expert with its gate
    "qwen2_moe": ("Qwen2Moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=96,
                                   shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, intermediate_size=96,
                                   norm_topk_prob=True, head_dim=16, decoder_sparse_step=1)),
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)),
    "olmoe": ("Olmoe", dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, clip_qkv=3.0)),
}


def tiny_moe(tmp_path_factory: Any, case: str, seed: int = 0) -> str:
    prefix, overrides = CASES[case]
    config = getattr(transformers, f"{prefix}Config")(**{**BASE, **overrides})
    config.architectures = [f"{prefix}ForCausalLM"]
    path = tmp_path_factory.mktemp(case)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif "gate" in name and param.dim() == 2 and param.shape[0] <= 8:
                    param.mul_(20.0)  # routers with clear choices: the same experts in both runs
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, Any]]:
    made = {}
    for case in CASES:
        path = tiny_moe(tmp_path_factory, case)
        made[case] = (path, hf_model(path))
    return made


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


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


def hf_greedy_logprobs(model: Any, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=n,
            min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0, output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens)]
    return tokens, logprobs


@pytest.mark.parametrize("case", list(CASES))
def test_engine_greedy_and_logprobs_match_transformers(checkpoints, case: str) -> None:
    path, hf = checkpoints[case]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=96, block_size=8, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, enable_chunked_prefill=True)
    prefix = _ids(24, seed=5).tolist()
    prompts = [prefix + _ids(n, seed=10 + n).tolist() for n in (3, 17)] + [_ids(13, seed=4).tolist()]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params)
    assert rest[0].num_cached_tokens == 24
    for out, prompt in zip(first + rest, prompts):
        tokens, logprobs = hf_greedy_logprobs(hf, prompt, 8)
        assert out.outputs[0].token_ids == tokens
        ours = [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, tokens)]
        assert max(abs(a - b) for a, b in zip(ours, logprobs)) < 1e-4
