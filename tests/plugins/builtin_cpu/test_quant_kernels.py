"""The compiled CPU quantized-linear kernels (``gguf_linear``, ``int8_linear``) against the
``gguf`` package's own dequantization and a float64 matmul, their place in the kernel table, and
the one-call decode step over quantized layers against the layer-by-layer model.

Weights of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are quantized with ``gguf.quants.quantize``; the package cannot
quantize Q4_K and Q6_K, so those are random valid blocks (random bytes with small fp16 scales).
"""

from __future__ import annotations

import functools

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT
from torch import nn

from helpers import check_fused_decode
from host.plugins.builtin_cpu.kernels import cpu_kernels

FORMATS = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q6_K]


@pytest.fixture(scope="module")
def k():
    kernels = cpu_kernels()
    assert kernels is not None, "the C++ kernels should build on this machine"
    return kernels


def random_blocks(qtype: QT, n: int, kdim: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """[n, row_bytes] uint8 GGUF blocks of an [n, kdim] weight of type ``qtype``."""
    rng = np.random.default_rng(seed)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (QT.Q4_K, QT.Q6_K):
        raw = rng.integers(0, 256, size=(n, kdim // block, size), dtype=np.uint8)

        def f16(lo: float, hi: float) -> np.ndarray:
            return rng.uniform(lo, hi, size=(n, kdim // block)).astype(np.float16).view(np.uint8).reshape(n, -1, 2)

        if qtype == QT.Q4_K:  # d, dmin: values d*sc*q - dmin*m with sc, m < 64 and q < 16
            raw[..., 0:2] = f16(1e-4 * scale, 2e-3 * scale)
            raw[..., 2:4] = f16(0.0, 2e-3 * scale)
        else:  # d at the end: values d*sc*(q-32), sc in int8, q < 64
            raw[..., 208:210] = f16(-4e-4 * scale, 4e-4 * scale)
        return raw.reshape(n, -1)
    weight = (rng.standard_normal((n, kdim)) * scale).astype(np.float32)
    return gguf.quants.quantize(weight, qtype)


@functools.lru_cache(maxsize=None)
def weight_case(qtype: QT, n: int, kdim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, the weight in float64 from ``gguf.quants.dequantize``)."""
    blocks = random_blocks(qtype, n, kdim, seed=n * 7 + kdim + int(qtype))
    ref = gguf.quants.dequantize(blocks, qtype).reshape(n, kdim)
    return torch.from_numpy(blocks), torch.from_numpy(ref.astype(np.float64))


def assert_matches(y: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal to the float64 reference up to float32 summation order (1e-4 of the largest output)."""
    tol = 1e-4 * float(ref.abs().max())
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=tol)


# (N, K): N = 4096 rows, an odd N with K = 1536 (SmolLM2-135M's down input), and a
# 1536 x 576 projection (its hidden size as K); K-quant rows hold whole 256-value blocks, so not K = 576
CASES = [
    (qtype, n, kdim)
    for qtype in FORMATS
    for n, kdim in [(4096, 512), (37, 1536), (1536, 576)]
    if kdim % gguf.GGML_QUANT_SIZES[qtype][0] == 0
]


@pytest.mark.parametrize("qtype,n,kdim", CASES, ids=[f"{q.name}-{n}x{kd}" for q, n, kd in CASES])
def test_gguf_linear_matches_gguf_dequantize(k, qtype, n, kdim):
    blocks, ref_w = weight_case(qtype, n, kdim)
    gen = torch.Generator().manual_seed(n + kdim)
    bias = torch.randn(n, generator=gen)
    for m in (1, 3, 8, 33):
        x = torch.randn(m, kdim, generator=gen)
        for b in (None, bias):
            ref = x.double() @ ref_w.T + (0 if b is None else b.double())
            y = k.gguf_linear(x, blocks, int(qtype), b)
            assert y.shape == (m, n) and y.dtype == torch.float32
            assert_matches(y, ref)


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q6_K], ids=lambda q: q.name)
def test_gguf_linear_bfloat16_and_strided_inputs(k, qtype):
    blocks, ref_w = weight_case(qtype, 37, 1536)
    wide = torch.randn(5, 1536 + 9)
    x = wide[:, :1536]  # rows at a stride
    assert_matches(k.gguf_linear(x, blocks, int(qtype), None), x.double() @ ref_w.T)
    xb = torch.randn(3, 1536).to(torch.bfloat16)
    y = k.gguf_linear(xb, blocks, int(qtype), None)
    assert y.dtype == torch.bfloat16
    ref = (xb.double() @ ref_w.T).to(torch.bfloat16).double()
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(k, qtype):
    # up to 8 rows share one pass over each weight row; every row still gets the arithmetic of
    # the 1-row kernel, to the bit (a speculative verification step of 1 + k rows must score
    # each position exactly as the plain decode step would)
    blocks, _ = weight_case(qtype, 37, 1536)
    x = torch.randn(8, 1536, generator=torch.Generator().manual_seed(int(qtype)))
    for op in (k.gguf_linear, k.gguf_linear_q8):  # float32 and Q8 activations
        alone = torch.cat([op(x[i : i + 1], blocks, int(qtype), None) for i in range(8)])
        for m in range(2, 9):
            assert torch.equal(op(x[:m], blocks, int(qtype), None), alone[:m]), f"{op.__name__}, {m} rows"


def test_gguf_linear_names_bad_inputs(k):
    blocks, _ = weight_case(QT.Q4_1, 37, 1536)
    with pytest.raises(RuntimeError, match=r"qtype 10 is not one of .*Q4_0 \(2\)"):
        k.gguf_linear(torch.randn(1, 1536), blocks, 10, None)
    with pytest.raises(RuntimeError, match="1536 columns"):
        k.gguf_linear(torch.randn(1, 1536), blocks[:, :-20], int(QT.Q4_1), None)
    with pytest.raises(RuntimeError, match="bias has 5 values for 37"):
        k.gguf_linear(torch.randn(1, 1536), blocks, int(QT.Q4_1), torch.zeros(5))


@pytest.mark.parametrize("n,kdim", [(4096, 576), (37, 1536), (7, 40)])
def test_int8_linear_matches_float64(k, n, kdim):
    gen = torch.Generator().manual_seed(n + kdim)
    qweight = torch.randint(-127, 128, (n, kdim), dtype=torch.int8, generator=gen)
    scales = torch.rand(n, generator=gen) * 0.01
    bias = torch.randn(n, generator=gen)
    ref_w = qweight.double() * scales.double()[:, None]
    for m in (1, 3, 8, 33):
        x = torch.randn(m, kdim, generator=gen)
        for b in (None, bias):
            ref = x.double() @ ref_w.T + (0 if b is None else b.double())
            assert_matches(k.int8_linear(x, qweight, scales, b), ref)


def test_cpu_kernels_take_over_the_kernel_table(k):
    from host.plugins.builtin_cpu.quant_kernels import register_cpu_quant_kernels
    from host.plugins.quantization import ops  # noqa: F401 - registers the torch references under "*"
    from host.sdk.kernels import kernel_entry, kernel_for, kernel_table, register_kernel, unregister_kernel

    name = register_cpu_quant_kernels(k)
    assert name == ("cpu_avx2" if "avx2" in k.kernels_isa() else "cpu_scalar")
    for op in ("gguf_linear", "int8_linear"):
        assert kernel_table()[op]["cpu"][0] == name
        assert kernel_entry(op, "cpu").priority == 10
    blocks, ref_w = weight_case(QT.Q8_0, 37, 1536)
    x = torch.randn(2, 1536)
    assert_matches(kernel_for("gguf_linear", "cpu")(x, blocks, int(QT.Q8_0), None), x.double() @ ref_w.T)
    # a batch of sequences ([B, T, K]) is flattened to rows and shaped back
    x3 = torch.randn(2, 3, 1536)
    y3 = kernel_for("gguf_linear", "cpu")(x3, blocks, int(QT.Q8_0), None)
    assert y3.shape == (2, 3, 37)
    assert_matches(y3.reshape(6, 37), x3.reshape(6, 1536).double() @ ref_w.T)
    # a platform plugin swaps the kernel with a higher priority
    register_kernel("int8_linear", "cpu", lambda *a: "swapped", name="test_override", priority=11)
    try:
        assert kernel_for("int8_linear", "cpu")() == "swapped"
    finally:
        unregister_kernel("int8_linear", "cpu", "test_override")
    assert kernel_table()["int8_linear"]["cpu"][0] == name


# ---- the fused decode step over quantized layers ----


class GGUFStandIn(nn.Module):
    """A quantized linear with the attributes the fused decode step reads (``scheme``,
    ``qweights``, ``qtypes``, ``shard_rows``, ``bias``), applied layer by layer through the
    ``gguf`` package's dequantization."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, shard_rows: list[int], qtypes: list[QT], seed: int):
        super().__init__()
        self.scheme = "gguf"
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.shard_rows, self.qtypes = list(shard_rows), [int(q) for q in qtypes]
        self.qweights, refs, row = [], [], 0
        for i, (rows, qtype) in enumerate(zip(shard_rows, qtypes)):
            if qtype in (QT.Q4_K, QT.Q6_K):
                blocks = random_blocks(qtype, rows, self.in_features, seed=seed + i, scale=0.02)
            else:
                blocks = gguf.quants.quantize(weight[row : row + rows].numpy(), qtype)
            self.qweights.append(torch.from_numpy(blocks))
            refs.append(torch.from_numpy(gguf.quants.dequantize(blocks, qtype)).reshape(rows, -1))
            row += rows
        self.ref_weight = torch.cat(refs).float()
        self.bias = None if bias is None else bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.ref_weight, self.bias)


class Int8StandIn(nn.Module):
    """An int8 linear (``scheme``, ``qweight``, ``scales``, ``bias``) applied with torch."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.scheme = "int8"
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        self.qweight = torch.round(weight / self.scales[:, None]).to(torch.int8)
        self.bias = None if bias is None else bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.qweight.float() * self.scales[:, None], self.bias)


def _plain(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float weight of a (packed) linear: the model's checkpoint weight in [N, K]."""
    from host.plugins.builtin_cpu.packed_linear import PackedLinear

    assert isinstance(linear, PackedLinear)
    w = linear.plain_weight
    if w.dim() == 4:  # the blocked [N/4, K/8, 4, 8] layout back to [N, K]
        n4, k8 = w.shape[:2]
        w = w.permute(0, 2, 1, 3).reshape(n4 * 4, k8 * 8)
    return w.clone(), linear.bias


def test_fused_decode_over_quantized_layers_matches_layer_by_layer(tiny_checkpoint, k):
    from host import LLM, SamplingParams
    from host.plugins.builtin_cpu.fused_decode import FusedDecode

    shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6)
    path = tiny_checkpoint("qwen2", seed=5, norm_std=0.2, bias_std=0.2, tie_word_embeddings=True, **shape)
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, block_size=4)
    decoder = llm.engine.executor.worker.model_runner.model.model
    q, kv = 256, 128
    plans = [  # per layer: (qkv shards' types, o, gate_up, down); None: int8
        ([QT.Q4_K, QT.Q6_K, QT.Q8_0], [QT.Q4_0], [QT.Q4_1, QT.Q4_1], [QT.Q6_K]),
        (None, None, None, None),
        ([QT.Q8_0, QT.Q5_0, QT.Q4_0], [QT.Q4_K], [QT.Q5_1, QT.Q5_0], [QT.Q8_0]),
    ]
    for li, (layer, plan) in enumerate(zip(decoder.layers, plans)):
        attn, mlp = layer.self_attn, layer.mlp
        for owner, attr, rows, qtypes in (
            (attn, "qkv_proj", [q, kv, kv], plan[0]),
            (attn, "o_proj", [256], plan[1]),
            (mlp, "gate_up_proj", [512, 512], plan[2]),
            (mlp, "down_proj", [256], plan[3]),
        ):
            weight, bias = _plain(getattr(owner, attr))
            standin = Int8StandIn(weight, bias) if qtypes is None else GGUFStandIn(weight, bias, rows, qtypes, seed=li * 10)
            setattr(owner, attr, standin)
    assert FusedDecode.supports(decoder) is None, "GGUF and int8 layers qualify for the fused path"
    fused = FusedDecode(decoder, k, max_rows=8)
    compared = check_fused_decode(decoder, fused, tol=2e-4)
    prompts = [[3 + (7 * i + j) % 290 for j in range(n)] for i, n in enumerate((5, 1, 9))]
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert compared and max(compared) == 3, "decode steps of the whole batch went through the fused path"


def test_fused_decode_declines_quantized_layers_it_cannot_run():
    from host.plugins.builtin_cpu.fused_decode import _quant_reason

    class Layer(nn.Module):
        def __init__(self, **attrs):
            super().__init__()
            self.bias = None
            self.in_features = 64
            for key, value in attrs.items():
                setattr(self, key, value)

    assert "fp8" in _quant_reason(Layer(scheme="fp8"))
    q5k = Layer(scheme="gguf", qweights=[torch.zeros(4, 176, dtype=torch.uint8)], qtypes=[int(QT.Q5_K)])
    assert "GGUF type 13 has no CPU kernel" in _quant_reason(q5k)
    ok = Layer(scheme="gguf", qweights=[torch.zeros(4, 40, dtype=torch.uint8)], qtypes=[int(QT.Q4_1)])
    assert _quant_reason(ok) is None


def test_isa_flags_name_what_the_module_was_built_for(k, monkeypatch):
    import host.plugins.builtin_cpu.kernels as kernels

    flags = kernels.isa_flags()
    assert ("avx2" in k.kernels_isa()) == ("-mavx2" in flags)
    monkeypatch.setattr(kernels, "_ISA", [])
    monkeypatch.setenv("HOST_CPU_ISA", "bogus")
    with pytest.raises(ValueError, match="HOST_CPU_ISA='bogus' is not one of avx512, avx2, scalar"):
        kernels.isa_flags()
    monkeypatch.setenv("HOST_CPU_ISA", "scalar")
    assert kernels.isa_flags() == ()
