"""Gemma 2 and Gemma 3 (text) against Hugging Face transformers on tiny random checkpoints.

The configs mix local (sliding window 8) and global layers and the prompts are longer than the
window, so the local layers really attend differently; norms are moved away from their initial
0 (Gemma's ``1 + w``), the Gemma 2 caps are small enough to bite. Compared: logits of the dense
path (no forward context), greedy tokens through ``LLM`` (``cpu_paged``: its compiled decode
kernel and the torch path) with chunked prefill and a second pass served from the prefix cache,
the KV cache spec of each layer, and a Gemma 3 GGUF written with the ``gguf`` package (norms
stored as llama.cpp stores them, ``1 + w``) loaded by both sides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from helpers import hf_greedy
from host import LLM, SamplingParams
from host.core.config import LoadConfig, ModelConfig
from host.core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from host.core.models.loader import load_model

VOCAB = 300
WINDOW = 8
SHAPE = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, vocab_size=VOCAB, max_position_embeddings=128, rms_norm_eps=1e-6, sliding_window=WINDOW,
    initializer_range=0.1, pad_token_id=0, bos_token_id=2, eos_token_id=1,
)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # alternating local / global (the Gemma 2 default), both caps small enough to matter
    "gemma2": ("Gemma2", dict(query_pre_attn_scalar=24, attn_logit_softcapping=1.0, final_logit_softcapping=5.0)),
    # local layers with their own RoPE base, q/k norms, a global layer between local ones
    "gemma3": ("Gemma3Text", dict(
        query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    )),
    # the global layers' RoPE scaled (as Gemma 3 4B+ are), untied head, final cap
    "gemma3-linear-rope": ("Gemma3Text", dict(
        query_pre_attn_scalar=32, tie_word_embeddings=False, final_logit_softcapping=8.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    )),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Any]]:
    """Each case's directory (``save_pretrained``) and its transformers model (float32, eager)."""
    made = {}
    for case, (prefix, overrides) in CONFIGS.items():
        config = getattr(transformers, f"{prefix}Config")(**{**SHAPE, **overrides})
        arch = prefix.removesuffix("Text") + "ForCausalLM"
        config.architectures = [arch]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = getattr(transformers, arch)(config).eval()
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith("norm.weight"):
                        param.copy_(0.3 * torch.randn_like(param))
        path = tmp_path_factory.mktemp(case)
        model.save_pretrained(path)
        made[case] = (str(path), model)
    return made


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids))))


@pytest.mark.parametrize("case", list(CONFIGS))
def test_logits_match_transformers(case: str, checkpoints: dict) -> None:
    path, hf = checkpoints[case]
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == hf.config.architectures[0]
    ids = torch.randint(3, VOCAB, (24,), generator=torch.Generator().manual_seed(1))
    ours = _logits(model, ids)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert (ours - ref).abs().max().item() < 1e-4
    if hf.config.final_logit_softcapping:
        assert ours.abs().max().item() < hf.config.final_logit_softcapping
    # the features under test change the result: without the local window (or the attention
    # cap) the logits are different
    attn = [layer.self_attn.attn for layer in model.model.layers]
    assert sorted({a.sliding_window for a in attn}, key=str) == [WINDOW, None]
    for a in attn:
        a.sliding_window = None
    assert (_logits(model, ids) - ref).abs().max().item() > 1e-3
    if case == "gemma2":
        model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
        assert {a.self_attn.attn.logits_soft_cap for a in model.model.layers} == {1.0}
        for layer in model.model.layers:
            layer.self_attn.attn.logits_soft_cap = None
        assert (_logits(model, ids) - ref).abs().max().item() > 1e-3


def test_bfloat16_close_to_transformers(checkpoints: dict) -> None:
    """bfloat16: the norms still compute in float32 with a float32 (1 + w), as the reference."""
    path, hf = checkpoints["gemma3"]
    model, _ = load_model(ModelConfig(model=path, dtype="bfloat16"), LoadConfig(), attn_backend=None)
    norm = model.model.layers[0].input_layernorm.weight
    assert norm.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.randint(3, VOCAB, (24,), generator=torch.Generator().manual_seed(2))
    ours = _logits(model, ids)
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        ref = hf16(ids[None]).logits[0].float()
    assert (ours - ref).abs().max().item() < 0.15  # a few bf16 ulps of |logit| ~ 5


PROMPTS = [
    [5 + (7 * j) % 280 for j in range(21)],
    [5 + (7 * j) % 280 for j in range(13)] + [9, 10, 11],  # shares 12 tokens (3 blocks) with the first
    [3 + (11 * j) % 290 for j in range(30)],
]
NEW = 10


@pytest.mark.parametrize("case", ["gemma2", "gemma3"])
def test_llm_greedy_matches_transformers_with_chunked_prefill_and_prefix_cache(case: str, checkpoints: dict) -> None:
    path, hf = checkpoints[case]
    want = [hf_greedy(hf, p, NEW) for p in PROMPTS]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, block_size=4, max_num_batched_tokens=16,
              enable_prefix_caching=True)
    runner = llm.engine.executor.worker.model_runner
    assert runner.attn_backend.name == "cpu_paged"
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in first] == want
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)  # served from the prefix cache
    assert [o.outputs[0].token_ids for o in again] == want
    assert all(o.num_cached_tokens > 0 for o in again)
    # the KV cache spec of each layer follows its type
    specs = runner.get_kv_cache_specs()
    types = hf.config.layer_types
    assert [type(s) for s in specs] == [SlidingWindowSpec if t == "sliding_attention" else FullAttentionSpec for t in types]
    assert {s.sliding_window for s in specs if isinstance(s, SlidingWindowSpec)} == {WINDOW}
    assert {(s.head_size, s.num_kv_heads) for s in specs} == {(32, 2)}


def test_attention_requirements_and_the_torch_paged_backend(checkpoints: dict) -> None:
    """Backend selection sees the window of the local layers and Gemma 2's soft cap (read from
    the config); ``torch_paged`` (the GPU platforms' fallback for the soft cap) gives the same
    tokens as the reference."""
    from types import SimpleNamespace

    from host.core.worker.attention_selector import attention_requirements

    engine = SimpleNamespace(cache=SimpleNamespace(block_size=16, cache_dtype="auto"))
    cpu = SimpleNamespace(device_type="cpu")
    for case, cap in (("gemma2", 1.0), ("gemma3", None)):
        req = attention_requirements(engine, cpu, checkpoints[case][1].config, torch.float32)
        assert (req.sliding_window, req.logits_soft_cap, req.head_size) == (WINDOW, cap, 32)
    path, hf = checkpoints["gemma2"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, block_size=4, attention_backend="torch_paged")
    out = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[::2]], SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in out] == [hf_greedy(hf, p, NEW) for p in PROMPTS[::2]]


# -- a Gemma 3 GGUF ------------------------------------------------------------------------------

def _write_gemma3_gguf(path: Path, seed: int = 0) -> Path:
    """A 6-layer Gemma 3 GGUF (hidden 64, head size 256 so transformers' fixed attention scale
    is the file's, 2 heads / 1 KV head, vocab 300, window 8; the default pattern: five local
    layers, then a global one): q/k/gate/up
    in Q5_0, v and the embedding in Q8_0, o and down in F32, norms ``1 + w`` as llama.cpp stores them."""
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    hidden, inter, heads, kv, hd, layers = 64, 128, 2, 1, 256, 6
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_sliding_window(WINDOW)
    writer.add_vocab_size(VOCAB)

    def tensor(name: str, rows: int, cols: int, qtype: QT, std: float) -> None:
        w = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if qtype == QT.F32:
            writer.add_tensor(name, w)
        else:
            writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + 0.3 * rng.standard_normal(size)).astype(np.float32))

    tensor("token_embd.weight", VOCAB, hidden, QT.Q8_0, 0.5)
    norm("output_norm.weight", hidden)
    for i in range(layers):
        b = f"blk.{i}"
        for part in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            norm(f"{b}.{part}.weight", hidden)
        norm(f"{b}.attn_q_norm.weight", hd)
        norm(f"{b}.attn_k_norm.weight", hd)
        tensor(f"{b}.attn_q.weight", heads * hd, hidden, QT.Q5_0, 0.1)
        tensor(f"{b}.attn_k.weight", kv * hd, hidden, QT.Q5_0, 0.1)
        tensor(f"{b}.attn_v.weight", kv * hd, hidden, QT.Q8_0, 0.1)
        tensor(f"{b}.attn_output.weight", hidden, heads * hd, QT.F32, 0.05)
        tensor(f"{b}.ffn_gate.weight", inter, hidden, QT.Q5_0, 0.1)
        tensor(f"{b}.ffn_up.weight", inter, hidden, QT.Q5_0, 0.1)
        tensor(f"{b}.ffn_down.weight", hidden, inter, QT.F32, 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gemma3_gguf_matches_transformers_dequantized_and_kept_quantized(tmp_path: Path) -> None:
    gguf = _write_gemma3_gguf(tmp_path / "tiny-gemma3.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf.name, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    model, config = load_model(ModelConfig(model=str(gguf)), LoadConfig(), attn_backend=None)
    assert config.model_type == "gemma3_text" and config.sliding_window == WINDOW
    assert config.layer_types == hf.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    # the norms came back as w (stored - 1) and are held as 1 + w again: the file's values
    stored = model.model.layers[0].input_layernorm.weight
    assert torch.allclose(stored, 1.0 + hf.model.layers[0].input_layernorm.weight.float())
    ids = torch.randint(3, VOCAB, (20,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (_logits(model, ids) - ref).abs().max().item() < 1e-4
    # served with the blocks kept (Q5_0, Q8_0 through the compiled kernels): the same tokens
    llm = LLM(str(gguf), skip_tokenizer_init=True, max_model_len=64, block_size=4, max_num_batched_tokens=16)
    runner = llm.engine.executor.worker.model_runner
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.scheme == "gguf" and qkv.qtypes == [6, 8]  # Q5_0 q/k, Q8_0 v
    prompts = [PROMPTS[0], PROMPTS[2]]
    out = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in out] == [hf_greedy(hf, p, NEW) for p in prompts]
