"""The EAGLE head (host.core.spec_decode.worker.eagle_head) and the ``eagle`` proposer.

- The head's forward equals a plain torch reference of its math (eagle_helpers.py) on a tiny
  llama target, for an EAGLE-1 style head (no input norm, the target's embedding and norm) and a
  two-layer head with its own embedding and norm;
- a bad head directory is a ValueError naming the problem;
- in the engine, greedy tokens with ``eagle`` equal those without speculation (themselves
  transformers') over 32 prompts with prefix caching and chunked prefill, no block is leaked, and
  every proposal the engine made equals the reference head's greedy chain on the same tokens
  (the paged, batched, catch-up-then-draft path computes what the dense math says).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import hf_greedy, hf_model

# -- a random head on disk and a plain torch reference of its math (RMSNorm, rotate-half RoPE,
# grouped-query causal attention, SiLU-GLU over one sequence), written from the math in
# host.core.spec_decode.worker.eagle_head's docstring, not from its code

def make_head(path: Path, target_config: Any, *, seed: int, layers: int = 1, intermediate: int = 80,
              input_norm: bool = False, own_embedding: bool = False, own_norm: bool = False,
              fc_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Write a random head (config.json + model.safetensors) for ``target_config`` into ``path``;
    returns its tensors by checkpoint name."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    h = target_config.hidden_size
    heads, kv_heads = target_config.num_attention_heads, target_config.num_key_value_heads
    d = h // heads
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    w: dict[str, torch.Tensor] = {"fc.weight": rnd(h, 2 * h) * fc_scale}
    for i in range(layers):
        p = f"layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rnd(heads * d, h)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * d, h)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * d, h)
        w[p + "self_attn.o_proj.weight"] = rnd(h, heads * d)
        w[p + "mlp.gate_proj.weight"] = rnd(intermediate, h)
        w[p + "mlp.up_proj.weight"] = rnd(intermediate, h)
        w[p + "mlp.down_proj.weight"] = rnd(h, intermediate)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(h)
        if input_norm or i > 0:
            w[p + "input_layernorm.weight"] = 1 + rnd(h)
    if own_embedding:
        w["embed_tokens.weight"] = rnd(target_config.vocab_size, h, std=0.5)
    if own_norm:
        w["norm.weight"] = 1 + rnd(h)
    save_file({k: v.contiguous() for k, v in w.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["EagleHead"], "hidden_size": h, "num_hidden_layers": layers,
        "intermediate_size": intermediate, "vocab_size": target_config.vocab_size,
    }))
    return w


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions.double()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def reference_head(w: dict[str, torch.Tensor], cfg: Any, hf_target: Any, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The head's output hidden states for one sequence (positions 0..n-1): ``ids[q]`` is the
    token at q + 1, ``hidden[q]`` the target's hidden state at q."""
    eps, theta = cfg.rms_norm_eps, float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"])
    h = cfg.hidden_size
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    d = h // heads
    n = ids.shape[0]
    emb = w["embed_tokens.weight"] if "embed_tokens.weight" in w else hf_target.model.embed_tokens.weight
    x = torch.cat([emb[ids], hidden], -1) @ w["fc.weight"].T
    pos = torch.arange(n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    layers = sorted({int(k.split(".")[1]) for k in w if k.startswith("layers.")})
    for i in layers:
        p = f"layers.{i}."
        residual = x
        a = _rms(x, w[p + "input_layernorm.weight"], eps) if p + "input_layernorm.weight" in w else x
        q = _rope((a @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, d), pos, theta)
        k = _rope((a @ w[p + "self_attn.k_proj.weight"].T).view(n, kv_heads, d), pos, theta)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(n, kv_heads, d)
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * d)
        x = residual + attn @ w[p + "self_attn.o_proj.weight"].T
        m = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    norm = w["norm.weight"] if "norm.weight" in w else hf_target.model.norm.weight
    return _rms(x, norm, eps)


def reference_drafts(w: dict[str, torch.Tensor], cfg: Any, hf_target: Any, tokens: list[int], k: int) -> list[int]:
    """The k greedy drafts of the head after the known ``tokens``: the head over positions
    0..L-2 (token q + 1, the target's hidden state at q), then each draft appended with the
    head's own hidden state at the previous position."""
    with torch.inference_mode():
        out = hf_target(torch.tensor([tokens]), output_hidden_states=True)
        target_hidden = out.hidden_states[-1][0]  # after the final norm
        ids = list(tokens[1:])
        hidden = target_hidden[: len(tokens) - 1]
        drafts: list[int] = []
        for _ in range(k):
            h = reference_head(w, cfg, hf_target, torch.tensor(ids), hidden)
            nxt = int(hf_target.lm_head(h[-1]).argmax())
            drafts.append(nxt)
            ids.append(nxt)
            hidden = torch.cat([hidden, h[-1:]], 0)
    return drafts


TARGET = dict(vocab_size=300, max_position_embeddings=256)


@pytest.fixture(scope="module")
def target(tiny_checkpoint):
    """(checkpoint path, our model loaded from it, transformers' model)."""
    from host.core.config import LoadConfig, ModelConfig
    from host.core.models.loader import load_model

    path = tiny_checkpoint("llama", seed=3, **TARGET)
    model, hf_config = load_model(ModelConfig(model=str(path), dtype="float32"), LoadConfig(), None)
    return path, model, hf_config, hf_model(path)


@pytest.mark.parametrize("variant", [
    dict(),  # EAGLE-1: no input_layernorm, the target's embedding and final norm
    dict(layers=2, input_norm=True, own_embedding=True, own_norm=True),
])
def test_head_forward_equals_reference(target, tmp_path, variant):
    from host.core.spec_decode.worker.eagle_head import load_eagle_head, read_head_config

    _, model, hf_config, hf = target
    weights = make_head(tmp_path / "head", hf_config, seed=5, **variant)
    head = load_eagle_head(str(tmp_path / "head"), model, hf_config, torch.float32, None)
    assert sum(1 for _ in head.parameters()) == len(weights) - 3 * len(head.layers)  # q/k/v, gate/up fused
    cfg = read_head_config(str(tmp_path / "head"), hf_config)
    assert cfg.intermediate_size == 80 and cfg.num_hidden_layers == variant.get("layers", 1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (11,), generator=g)
    hidden = torch.randn(11, hf_config.hidden_size, generator=g)
    with torch.inference_mode():
        got = head(ids, torch.arange(11), hidden)
        want = reference_head(weights, cfg, hf, ids, hidden)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(head.compute_logits(got), hf.lm_head(want), rtol=1e-4, atol=1e-4)
    # the shared modules are the target's, not copies
    assert (head.embed_tokens is None) == (not variant.get("own_embedding"))
    assert all(p.data_ptr() != q.data_ptr() for p in head.parameters() for q in model.parameters())


def test_bad_head_directories(target, tmp_path):
    from safetensors.torch import save_file

    from host.core.spec_decode.worker.eagle_head import load_eagle_head

    _, model, hf_config, _ = target

    def load(path):
        return load_eagle_head(str(path), model, hf_config, torch.float32, None)

    with pytest.raises(ValueError, match="does not exist"):
        load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load(tmp_path / "empty")
    weights = make_head(tmp_path / "wide", hf_config, seed=1)
    cfg = json.loads((tmp_path / "wide" / "config.json").read_text())
    (tmp_path / "wide" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 128}))
    with pytest.raises(ValueError, match="hidden_size=128.*target model's hidden_size=64"):
        load(tmp_path / "wide")
    make_head(tmp_path / "nofc", hf_config, seed=1)
    save_file({k: v for k, v in weights.items() if k != "fc.weight"}, str(tmp_path / "nofc" / "model.safetensors"))
    with pytest.raises(ValueError, match="no fc.weight"):
        load(tmp_path / "nofc")
    make_head(tmp_path / "extra", hf_config, seed=1)
    save_file({**weights, "layers.3.mlp.up_proj.weight": torch.zeros(80, 64)}, str(tmp_path / "extra" / "model.safetensors"))
    with pytest.raises(ValueError, match="'layers.3.mlp.up_proj.weight' has no matching parameter"):
        load(tmp_path / "extra")
    make_head(tmp_path / "partial", hf_config, seed=1)
    save_file({k: v for k, v in weights.items() if "k_proj" not in k}, str(tmp_path / "partial" / "model.safetensors"))
    with pytest.raises(ValueError, match="partial.*qkv_proj"):
        load(tmp_path / "partial")


# -- in the engine ---------------------------------------------------------------------------------

K = 3
MAX_NEW = 8
ENGINE = dict(skip_tokenizer_init=True, max_num_batched_tokens=64, max_num_seqs=16, enable_prefix_caching=True)


def prompts_of(n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of 3-40 tokens; a third share a 20-token prefix (prefix-cache hits)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(20)]
    return [(shared if i % 3 == 0 else []) + [rng.randrange(3, 300) for _ in range(rng.randrange(3, 21))] for i in range(n)]


def generate(llm: Any, prompts: list[list[int]]) -> list[list[int]]:
    from host import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_eagle_in_the_engine(target, tmp_path):
    from host import LLM
    from host.core.spec_decode.worker.eagle import EagleProposer

    path, _, hf_config, hf = target
    weights = make_head(tmp_path / "head", hf_config, seed=7)
    prompts = prompts_of(32)
    reference = generate(LLM(model=str(path), **ENGINE), prompts)
    assert [hf_greedy(hf, p, MAX_NEW) for p in prompts[:3]] == reference[:3]
    llm = LLM(model=str(path), speculative_config={"method": "eagle", "model": str(tmp_path / "head"), "num_speculative_tokens": K},
              **ENGINE)
    proposer = llm.engine.executor.worker.model_runner.spec_decode.proposer
    assert isinstance(proposer, EagleProposer)
    seen: list[tuple[list[int], list[int]]] = []
    propose = proposer.propose

    def recording(batch):
        drafts = propose(batch)
        seen.extend(([int(t) for t in tokens], list(d)) for tokens, d in zip(batch.token_ids, drafts) if d)
        return drafts

    proposer.propose = recording
    assert generate(llm, prompts) == reference
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests and not manager.req_to_blocks
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
    # the head's KV layer joins the target's in the block size
    assert len(llm.engine.kv_cache_config.kv_cache_specs) == hf_config.num_hidden_layers + 1
    assert len(seen) > 32 and all(len(d) <= K for _, d in seen)
    cfg = proposer.hf_config
    for tokens, drafts in random.Random(0).sample(seen, 16):
        assert drafts == reference_drafts(weights, cfg, hf, tokens, len(drafts)), f"after {len(tokens)} tokens"
