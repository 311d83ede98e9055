"""Opt-in Q8 activations (``--quantized-activations q8``) on the CPU GGUF kernels.

- The compiled quantizer equals the torch reference of the same math bit for bit (block scales
  ``amax / 127``, ties rounded to even, all-zero blocks).
- ``gguf_linear_q8`` (integer dot products up to 8 rows, the dequantized Q8 rows through the
  panel path above) equals ``dequantize_q8(quantize_q8(x)) @ dequantize(W)^T`` from the torch
  reference to 1e-5 of the largest output, and the float32-activation product from the ``gguf``
  package's dequantization within 2e-2 of the largest output (measured: about 6e-3).
- The fused decode step over GGUF layers marked q8 equals the layer-by-layer model whose layers
  compute the torch reference.
- The flag resolves through the plan to the method; a method without Q8 activations is refused.
- End to end on the default model (SmolLM2-135M Q4_1): q8 perplexity on the shipped text within
  +2% of the default kept-quantized blocks (measured +0.3%: docs/quantization.md), with steps of
  at most 8 tokens so the integer kernels score every token.
"""

from __future__ import annotations

import functools
import math

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT
from quant_blocks import random_blocks
from torch import nn

from helpers import check_fused_decode
from host.plugins.builtin_cpu.kernels import cpu_kernels
from host.plugins.quantization import ops

FORMATS = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q6_K]


@functools.lru_cache(maxsize=None)
def weight_case(qtype: QT, n: int, kdim: int, scale: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """(random valid blocks of an [n, kdim] weight, that weight in float64 from ``gguf.quants.dequantize``)."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(int(qtype), n, kdim // block, seed=n * 7 + kdim + int(qtype), scale=scale)
    ref = gguf.quants.dequantize(blocks, qtype).reshape(n, kdim)
    return torch.from_numpy(blocks), torch.from_numpy(ref.astype(np.float64))


@pytest.fixture(scope="module")
def k():
    kernels = cpu_kernels()
    assert kernels is not None, "the C++ kernels should build on this machine"
    return kernels


def test_quantizer_matches_the_reference_bit_for_bit(k):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=gen) * torch.logspace(-3, 2, 5).unsqueeze(1)
    x[1, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    x[2, :32] = torch.arange(32, dtype=torch.float32) - 15.5  # ties: amax 15.5 -> d = 15.5 / 127
    x[3, :32] = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5, 1.5] + [0.0] * 26)  # d = 1: exact ties round to even
    q, d = k.quantize_q8(x)
    qr, dr = ops.quantize_q8_reference(x)
    assert q.dtype == torch.int8 and d.shape == (5, 8)
    assert torch.equal(q, qr) and torch.equal(d, dr)
    assert q[3, :6].tolist() == [127, 2, -4, 0, 0, 2]
    assert d[1, 1] == 0 and not q[1, 32:64].any()
    back = ops.dequantize_q8_reference(q, d)
    assert ((back - x).abs() <= d.repeat_interleave(32, dim=1) / 2 * (1 + 1e-6)).all(), "within half a step"


CASES = [(qtype, 37, 1536) for qtype in FORMATS] + [(QT.Q4_1, 300, 576), (QT.Q8_0, 300, 576)]  # 576: SmolLM2's hidden size


@pytest.mark.parametrize("qtype,n,kdim", CASES, ids=[f"{q.name}-{n}x{kd}" for q, n, kd in CASES])
def test_gguf_linear_q8_matches_the_same_math_and_float(k, qtype, n, kdim):
    blocks, ref_w = weight_case(qtype, n, kdim)
    gen = torch.Generator().manual_seed(n + kdim)
    bias = torch.randn(n, generator=gen)
    for m in (1, 3, 8, 20):  # the integer kernel for 1..8 rows, the panel path for 20
        x = torch.randn(m, kdim, generator=gen)
        for b in (None, bias):
            y = k.gguf_linear_q8(x, blocks, int(qtype), b)
            same = ops.gguf_linear_q8_reference(x, blocks, int(qtype), b)
            assert y.shape == (m, n) and y.dtype == torch.float32
            torch.testing.assert_close(y, same, rtol=1e-5, atol=1e-5 * float(same.abs().max()))
            exact = x.double() @ ref_w.T + (0 if b is None else b.double())
            err = float((y.double() - exact).abs().max() / exact.abs().max())
            assert err < 2e-2, f"{qtype.name} M={m}: Q8 activations off the float product by {err:.2e}"
            assert err > 1e-6, "the activations were really quantized"


def test_the_kernel_table_and_the_op(k):
    from torch.library import opcheck

    from host.plugins.builtin_cpu.quant_kernels import register_cpu_quant_kernels
    from host.sdk.kernels import kernel_entry

    name = register_cpu_quant_kernels(k)
    assert kernel_entry("gguf_linear_q8", "cpu").name == name
    assert kernel_entry("gguf_linear_q8", "*").name == "torch_reference"
    blocks, _ = weight_case(QT.Q4_1, 37, 1536)
    x = torch.randn(2, 3, 1536)
    y = ops.gguf_linear_q8(x.reshape(6, 1536), blocks, int(QT.Q4_1), None)
    torch.testing.assert_close(y, ops.gguf_linear_q8_reference(x.reshape(6, 1536), blocks, int(QT.Q4_1), None), rtol=1e-5, atol=1e-4)
    xb = x.reshape(6, 1536).to(torch.bfloat16)
    assert ops.gguf_linear_q8(xb, blocks, int(QT.Q4_1), None).dtype == torch.bfloat16
    opcheck(torch.ops.host_quant.gguf_linear_q8.default, (torch.randn(3, 1536), blocks, int(QT.Q4_1), None))
    with pytest.raises(RuntimeError, match="not a multiple of 32"):
        k.quantize_q8(torch.randn(2, 40))


class Q8StandIn(nn.Module):
    """A GGUF linear marked for Q8 activations, with the attributes the fused decode step reads
    (``scheme``, ``qweights``, ``qtypes``, ``shard_rows``, ``bias``, ``quantized_activations``),
    applied layer by layer as the torch reference does: the input rows rounded through Q8 blocks,
    times the ``gguf`` package's dequantized weight."""

    def __init__(self, kdim: int, shard_rows: list[int], qtypes: list[QT], seed: int):
        super().__init__()
        self.scheme, self.quantized_activations = "gguf", "q8"
        self.in_features, self.out_features = kdim, sum(shard_rows)
        self.shard_rows, self.qtypes = list(shard_rows), [int(q) for q in qtypes]
        cases = [weight_case(qtype, rows + seed, kdim, scale=0.01) for rows, qtype in zip(shard_rows, qtypes)]
        self.qweights = [blocks[:rows].contiguous() for (blocks, _), rows in zip(cases, shard_rows)]
        self.ref_weight = torch.cat([ref[:rows] for (_, ref), rows in zip(cases, shard_rows)]).float()
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, d = ops.quantize_q8_reference(x)
        return F.linear(ops.dequantize_q8_reference(q, d).reshape(x.shape), self.ref_weight, self.bias)


def test_fused_decode_with_q8_activations_matches_layer_by_layer(tiny_checkpoint, k):
    from host import LLM, SamplingParams
    from host.plugins.builtin_cpu.fused_decode import FusedDecode

    shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6)
    path = tiny_checkpoint("qwen2", seed=6, norm_std=0.2, bias_std=0.2, tie_word_embeddings=True, **shape)
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, block_size=4)
    try:
        decoder = llm.engine.executor.worker.model_runner.model.model
        plans = [([QT.Q4_K, QT.Q6_K, QT.Q8_0], [QT.Q4_0], [QT.Q4_1, QT.Q4_1], [QT.Q6_K]),
                 ([QT.Q4_1, QT.Q4_1, QT.Q4_1], [QT.Q4_K], [QT.Q8_0, QT.Q4_K], [QT.Q4_1])]
        for li, (layer, plan) in enumerate(zip(decoder.layers, plans)):
            attn, mlp = layer.self_attn, layer.mlp
            for owner, attr, rows, qtypes in ((attn, "qkv_proj", [256, 128, 128], plan[0]), (attn, "o_proj", [256], plan[1]),
                                              (mlp, "gate_up_proj", [512, 512], plan[2]), (mlp, "down_proj", [256], plan[3])):
                setattr(owner, attr, Q8StandIn(512 if attr == "down_proj" else 256, rows, qtypes, seed=li))
        assert FusedDecode.supports(decoder) is None
        fused = FusedDecode(decoder, k, max_rows=8)
        assert fused.linear_meta[0] == 3, "GGUF layers marked q8 run the Q8-activation kernel"
        # a rounding flip of one activation (inputs equal up to float32 summation order) moves an
        # output by about one Q8 step times a weight: far below the Q8-vs-float gap (~1e-2)
        compared = check_fused_decode(decoder, fused, tol=1e-3)
        prompts = [[3 + (7 * i + j) % 290 for j in range(n)] for i, n in enumerate((5, 1, 9))]
        llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        assert compared and max(compared) == 3
    finally:
        llm.shutdown()


def test_the_flag_reaches_the_method_and_is_refused_elsewhere(tmp_path):
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from host.core.config import EngineConfig, ModelConfig, QuantizationConfig
    from host.core.engine_args import EngineArgs
    from host.core.models.quant_plan import registered_methods, resolve_quant_plan

    assert EngineArgs().quantized_activations == "none"
    with pytest.raises(ValueError, match="'q4' is not one of none, q8"):
        QuantizationConfig(activations="q4")
    hf = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    cpu = SimpleNamespace(name="cpu", device_type="cpu", supported_quantization=[], get_device_capability=lambda device_id=0: None)
    registry = registered_methods()

    def plan(quantization=None, gguf_file=True):
        path = str(tmp_path / "model.gguf") if gguf_file else str(tmp_path)
        quant = QuantizationConfig(quantization, activations="q8")
        return resolve_quant_plan(EngineConfig(model=ModelConfig(model=path, dtype="float32", hf_config=hf, resolved_path=path), quant=quant), registry, cpu)

    resolved = plan()
    assert resolved.method == "gguf" and resolved.activations == "q8"
    method = resolved.bind(registry)._methods["gguf"]
    assert method.activations == "q8" and method.get_linear_method("lm_head").activations == "q8"
    with pytest.raises(ValueError, match="'int8' does not quantize activations .*methods that do: gguf"):
        plan("int8", gguf_file=False)
    with pytest.raises(ValueError, match="needs quantized weights.*gguf"):
        plan("none")


def _perplexity(llm, chunks) -> float:
    from host import SamplingParams

    outs = llm.generate([{"prompt_token_ids": c} for c in chunks], SamplingParams(prompt_logprobs=0, max_tokens=1, temperature=0.0))
    per_token = [pos[tok].logprob for chunk, out in zip(chunks, outs) for tok, pos in zip(chunk[1:], out.prompt_logprobs[1:])]
    return math.exp(-sum(per_token) / len(per_token))


def test_q8_perplexity_on_the_default_model_within_2_percent(capsys):
    from perplexity import load_text_ids, windows
    from transformers import AutoTokenizer

    from host import LLM
    from host.core.models.default_model import resolve_model_path

    window = 256
    chunks = windows(load_text_ids(AutoTokenizer.from_pretrained(resolve_model_path(None)), limit=window), window)
    ppl = {}
    # the default kernels compute the same products at any batch size (up to summation order);
    # with q8, steps of at most 8 tokens send every row through the integer small-batch kernels
    for name, extra in (("default", {}), ("q8", {"quantized_activations": "q8", "max_num_batched_tokens": 8})):
        llm = LLM(max_model_len=window + 8, **extra)
        try:
            ppl[name] = _perplexity(llm, chunks)
        finally:
            llm.shutdown()
    with capsys.disabled():
        print(f"\nSmolLM2-135M perplexity over {window - 1} tokens: gguf {ppl['default']:.4f}, "
              f"gguf + q8 activations {ppl['q8']:.4f} ({ppl['q8'] / ppl['default'] - 1:+.2%})")
    assert ppl["q8"] != ppl["default"], "the q8 engine really quantized its activations"
    assert ppl["q8"] <= 1.02 * ppl["default"]

