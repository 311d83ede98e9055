"""The GPU platforms' Triton kernels (``plugins/triton_ops/``) against their torch references.

Without a GPU they run under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU tensors), so
CI checks them; with one they run on it. Shapes are small: the interpreter is slow.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
from host.plugins.triton_ops import kernels as tk  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton


def make_paged(seq_lens, query_lens, heads, kv_heads, head_dim, block_size, dtype=torch.float32, seed=0):
    """A paged cache holding each request's context (shuffled physical blocks) and the query rows."""
    gen = torch.Generator().manual_seed(seed)
    R = len(seq_lens)
    blocks_per = [math.ceil(L / block_size) for L in seq_lens]
    num_blocks = sum(blocks_per) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per)
    table = torch.zeros(R, max_blocks, dtype=torch.int32)
    i = 0
    for r, nb in enumerate(blocks_per):
        table[r, :nb] = torch.tensor(perm[i : i + nb], dtype=torch.int32)
        i += nb
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    query = torch.randn(int(qsl[-1]), heads, head_dim, generator=gen).to(dtype)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    to = lambda t: t.to(DEV)  # noqa: E731
    return to(query), to(k_cache), to(v_cache), to(table), to(qsl), to(seq)


@pytest.mark.parametrize(
    "case",
    [
        dict(seq=[5, 17, 33], q=[5, 17, 33], heads=4, kvh=4, window=None),  # fresh prompts, MHA
        dict(seq=[40, 9, 21], q=[1, 1, 1], heads=8, kvh=2, window=None),  # decodes, GQA 4
        dict(seq=[50, 16, 3], q=[7, 16, 1], heads=6, kvh=2, window=None),  # prefix hits + mixed
        dict(seq=[48, 30], q=[20, 1], heads=4, kvh=1, window=9),  # sliding window, MQA
        dict(seq=[32], q=[16], heads=2, kvh=2, window=None),  # block boundary exactly
    ],
)
def test_paged_attention_matches_reference(case):
    q, kc, vc, table, qsl, seq = make_paged(case["seq"], case["q"], case["heads"], case["kvh"], 32, 16)
    scale = 32**-0.5
    got = tk.paged_attention(q, kc, vc, table, qsl, seq, max(case["q"]), scale, case["window"])
    want = tk.paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), table.cpu(), qsl.cpu(), seq.cpu(), scale, case["window"])
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)


def test_paged_attention_bf16_kv():
    q, kc, vc, table, qsl, seq = make_paged([24, 7], [3, 7], 4, 2, 16, 8, dtype=torch.bfloat16, seed=3)
    got = tk.paged_attention(q, kc, vc, table, qsl, seq, 7, 0.25)
    want = tk.paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), table.cpu(), qsl.cpu(), seq.cpu(), 0.25)
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4), (6, 2), (8, 1)])
def test_split_decode_matches_reference(window, heads, kv_heads):
    """GQA-grouped decode (group sizes 2, 1, 3 and 8), several spans per request."""
    q, kc, vc, table, qsl, seq = make_paged([130, 7, 64], [1, 1, 1], heads, kv_heads, 32, 16, seed=5)
    scale = 32**-0.5
    got = tk.paged_decode_split(q, kc, vc, table, seq, scale, window, span=32)
    want = tk.paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), table.cpu(), qsl.cpu(), seq.cpu(), scale, window)
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)


def test_reshape_and_cache_skips_negative_slots():
    gen = torch.Generator().manual_seed(1)
    key = torch.randn(5, 2, 8, generator=gen).to(DEV)
    value = torch.randn(5, 2, 8, generator=gen).to(DEV)
    kc = torch.zeros(4, 4, 2, 8, device=DEV)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([3, 4, -1, 15, 0], dtype=torch.int64, device=DEV)
    tk.reshape_and_cache(key, value, kc, vc, slots)
    kr, vr = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    tk.reshape_and_cache_ref(key.cpu(), value.cpu(), kr, vr, slots.cpu())
    assert torch.equal(kc.cpu(), kr) and torch.equal(vc.cpu(), vr)
    assert float(kc.abs().sum()) > 0 and float(kc[0, 2].abs().sum()) == 0  # slot 2 was never written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_rotary_and_activation(dtype):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 40, generator=gen) * 3).to(dtype).to(DEV)
    res = torch.randn(6, 40, generator=gen).to(dtype).to(DEV)
    w = (1 + 0.1 * torch.randn(40, generator=gen)).to(dtype).to(DEV)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(tk.rms_norm(x, w, 1e-6).cpu(), tk.rms_norm_ref(x.cpu(), w.cpu(), 1e-6), **tol)
    want_out, want_res = tk.rms_norm_ref(x.cpu(), w.cpu(), 1e-6, residual=res.cpu())
    r = res.clone()
    out, r2 = tk.fused_add_rms_norm(x, r, w, 1e-6)
    assert r2 is r
    torch.testing.assert_close(r.cpu(), want_res, **tol)
    torch.testing.assert_close(out.cpu(), want_out, **tol)
    # rotary on q/k heads inside a wider qkv row, partial rotary dims
    cache = torch.cat([torch.rand(30, 6, generator=gen).cos(), torch.rand(30, 6, generator=gen).sin()], -1).to(DEV)
    qkv = torch.randn(5, 4 * 16, generator=gen).to(dtype).to(DEV)
    view = qkv[:, : 3 * 16].view(5, 3, 16)
    pos = torch.tensor([0, 7, 29, 3, 3], device=DEV)
    want = tk.rotary_neox_ref(view.cpu(), pos.cpu(), cache.cpu())
    tail = qkv[:, 3 * 16 :].clone()
    tk.rotary_neox(view, pos, cache)
    torch.testing.assert_close(view.cpu(), want, **tol)
    assert torch.equal(qkv[:, 3 * 16 :], tail)
    g = torch.randn(4, 2 * 24, generator=gen).to(dtype).to(DEV)
    torch.testing.assert_close(tk.silu_and_mul(g).cpu(), tk.silu_and_mul_ref(g.cpu()), **tol)


@pytest.mark.parametrize("arch", ["llama", "qwen2-window"])
def test_engine_with_triton_backend_matches_transformers(tiny_checkpoint, arch):
    """The whole engine with ``--attention-backend triton_paged`` (interpreted on CPU):
    greedy tokens equal transformers', with chunked prefill and prefix-cache hits in the mix."""
    import random

    from helpers import hf_greedy, hf_model
    from host import LLM, SamplingParams

    if arch == "llama":
        path = tiny_checkpoint("llama", max_position_embeddings=256, tie_word_embeddings=True)
    else:
        path = tiny_checkpoint("qwen2", max_position_embeddings=256, use_sliding_window=True, sliding_window=6,
                               max_window_layers=1)
    hf = hf_model(path)
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, attention_backend="triton_paged",
              max_num_batched_tokens=16, max_num_seqs=4, block_size=8)
    runner = llm.engine.executor.worker.model_runner
    assert runner.attn_backend.name == "triton_paged"
    rng = random.Random(1)
    shared = [rng.randrange(3, 300) for _ in range(16)]
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (5, 19)] + [shared + [7], shared + [9, 11]]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 6)
    assert llm.engine.kv_cache_manager.prefix_cache_stats.hits > 0


def test_custom_ops_pass_opcheck_and_trace():
    """Each op's schema, fake implementation and mutation declarations are right
    (``torch.library.opcheck``), so torch.compile can trace a model that uses them."""
    from host.plugins.triton_ops import custom_ops  # noqa: F401 - registers the ops

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 32, generator=gen).to(DEV)
    w = torch.rand(32, generator=gen).to(DEV) + 0.5
    torch.library.opcheck(torch.ops.host.rms_norm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.host.fused_add_rms_norm.default, (x, x.clone() * 0.5, w, 1e-6))
    torch.library.opcheck(torch.ops.host.silu_and_mul.default, (torch.randn(3, 16, generator=gen).to(DEV),))
    cache = torch.randn(10, 8, generator=gen).to(DEV)
    torch.library.opcheck(torch.ops.host.rotary_neox.default, (torch.randn(2, 3, 8, generator=gen).to(DEV), torch.tensor([1, 4], device=DEV), cache))
    q, kc, vc, table, qsl, seq = make_paged([9, 4], [2, 4], 4, 2, 16, 4, seed=9)
    torch.library.opcheck(torch.ops.host.paged_attention.default, (q, kc, vc, table, qsl, seq, 4, 0.25, 0))
    key = torch.randn(2, 2, 16, generator=gen).to(DEV)
    torch.library.opcheck(torch.ops.host.reshape_and_cache.default, (key, key.clone(), kc.clone(), vc.clone(), torch.tensor([0, 5], device=DEV)))


def test_attached_ops_give_the_model_s_own_outputs():
    import transformers

    from host.core.models.llama import Qwen3ForCausalLM
    from host.plugins.triton_ops.custom_ops import attach_triton_ops

    config = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=200, max_position_embeddings=64)
    torch.manual_seed(3)
    plain = Qwen3ForCausalLM(config).eval()
    for p in plain.parameters():
        torch.nn.init.normal_(p, std=0.2)
    fast = Qwen3ForCausalLM(config).eval()
    fast.load_state_dict(plain.state_dict())
    assert attach_triton_ops(fast) == 2 * 4 + 1 + 1 + 2  # 4 norms per layer (incl. q/k), final norm, rotary, 2 activations
    ids = torch.tensor([5, 9, 13, 2, 7, 100])
    pos = torch.arange(6)
    with torch.inference_mode():
        want = plain.compute_logits(plain(ids, pos))
        got = fast.compute_logits(fast(ids, pos))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
